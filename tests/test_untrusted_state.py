"""tokmix's own state is input (issue 31): every file a command reads back from a run (the record of what it
created, the state folder's records, the lock, the shards) is checked before it steers anything; a recorded
path is confined to the run; only regular files are opened, so a FIFO or a device never hangs a command; a
damaged file is one line naming it, in every command; the temporary-file sweep removes only what tokmix
recorded; a held-out file never trains anywhere; export and report keep the run's publish rule.

Most checks call the CLI in-process (typer's runner: the same code a user's command runs, without an
interpreter's start-up each); a check that could hang runs in a thread that the test abandons, and fails,
when it has not returned in time. One module-scoped finished run (its intermediates kept) is copied per test."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.corpus import make_inputs
from tokmix.cli import app
from tokmix.ownership import RECORD_SEAL_LINE
from tokmix.shards import OWN_FILES_REMEDY

TOKMIX = Path(sys.executable).with_name("tokmix")
HANG = 600  # seconds: a command still blocked then is hung (each returns in about one; generous for a loaded CI)


def cli(*args: str | Path):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def run_process(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOKMIX), *map(str, args)], capture_output=True, text=True, timeout=HANG * 3,
                          env={**os.environ, **(env or {})}, start_new_session=True)


def one_line(result) -> str:
    """The single line a refused command printed on stderr (asserting it is one line and no traceback)."""
    text = result.stderr.strip()
    assert "Traceback" not in text and "\n" not in text, text[-3000:]
    return text


def no_hang(fn, *fifos: Path):
    """fn() in a thread; fails when it has not returned after HANG seconds (its FIFOs are then opened for
    writing, which releases a reader blocked on them)."""
    box = {}

    def call() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # raised in the test's thread below
            box["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(HANG)
    if thread.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"hung on {[str(f) for f in fifos]}")
    if "error" in box:
        raise box["error"]
    return box["result"]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and not p.is_symlink()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_inputs(tmp_path_factory.mktemp("state"), doc_limit=300, rows_per_group=16)


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "out"
    proc = run_process("run", corpus, "--out", out, "--workers", "2", "--keep-streams")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture
def out(finished, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(finished, copy, symlinks=True)
    return copy


def reseal(record: Path, lines: list[str]) -> None:
    """What a user who edits the record and recomputes its seal writes."""
    body = record.read_text().splitlines()[:-1] + lines
    record.write_text("\n".join(body + [RECORD_SEAL_LINE + hashlib.sha256(("\n".join(body) + "\n").encode())
                                        .hexdigest()]) + "\n")


# ---------------------------------------------------------------------------- the record steers no deletion
@pytest.mark.parametrize("line", ["{victim}", "../victim.txt", "streams/../../victim.txt", "./../victim.txt",
                                  "train_000.bin/../../victim.txt"])
@pytest.mark.parametrize("sealed", [False, True], ids=["appended", "resealed"])
def test_a_recorded_path_outside_the_run_is_refused_and_nothing_is_deleted(corpus, out, tmp_path, line, sealed):
    """The issue's case (lines `/abs/file` and `../file` added to tokmix-state/created, then --restart: both
    files were deleted) and its kin, appended to the record or with the record resealed as a user could."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's\n")
    line = line.format(victim=victim)
    record = out / "tokmix-state/created"
    if sealed:
        reseal(record, [line])
    else:
        record.write_text(record.read_text() + line + "\n")
    before = tree(tmp_path)
    for more in (["--restart"], []):
        result = cli("run", corpus, "--out", out, *more)
        assert result.exit_code == 2
        where = "outside the output directory" if ".." in line or line.startswith("/") else \
            "not a path tokmix creates there"
        assert one_line(result) == f"error: {record}: damaged (it names {line!r}, {where}); {OWN_FILES_REMEDY}"
    assert tree(tmp_path) == before  # the victim, the run: nothing removed


def test_a_stream_folder_swapped_for_a_link_is_never_emptied_or_written_through(corpus, out, tmp_path):
    """A recorded folder whose place now holds a link to elsewhere: --restart would have removed tokmix-named
    files there (units/000000.tok), and the run written its units there."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(out / "streams/edu", elsewhere)
    shutil.rmtree(out / "streams/edu")
    (out / "streams/edu").symlink_to(elsewhere)
    before = tree(elsewhere)
    result = cli("run", corpus, "--out", out, "--restart")
    assert result.exit_code == 2
    assert one_line(result) == (f"error: {out / 'streams/edu'}: is a link (to {elsewhere}); tokmix writes only "
                                "inside its output directory: remove the link, or choose another --out")
    assert tree(elsewhere) == before


@pytest.mark.parametrize("damage", ["truncated", "garbage", "fifo", "edited"])
def test_a_damaged_record_is_named_and_acted_on_by_no_command(corpus, out, damage):
    record = out / "tokmix-state/created"
    notes = out / "val_notes.bin"  # the user's, named like a holdout
    notes.write_text("the user's\n")
    text = record.read_text()
    if damage == "truncated":
        record.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        record.write_bytes(b"\xff\xfe not a record")
    elif damage == "fifo":
        record.unlink()
        os.mkfifo(record)
    else:  # a line of tokmix's shape that names the user's file, the seal left as it was
        lines = text.splitlines()
        record.write_text("\n".join(lines[:-1] + ["val_notes.bin", lines[-1]]) + "\n")
    result = no_hang(lambda: cli("run", corpus, "--out", out, "--restart"), record)
    assert result.exit_code == 2
    assert one_line(result).startswith(f"error: {record}: damaged (") and result.stderr.strip().endswith(
        OWN_FILES_REMEDY)
    assert notes.read_text() == "the user's\n" and (out / "train_000.bin").exists()


# ---------------------------------------------------------------------------- only regular files are opened
def test_a_fifo_or_device_among_the_sources_is_named_before_it_is_opened(corpus, tmp_path):
    root = corpus.parent
    fifo = root / "corpus/edu/part-9.parquet"
    os.mkfifo(fifo)
    try:
        split = root / "data/file_splits.json"
        kept = split.read_bytes()
        split.unlink()  # the run lists the sources again
        try:
            result = no_hang(lambda: cli("plan", corpus, "--out", tmp_path / "o"), fifo)
            pattern = root / "corpus/edu/*.parquet"
            want = (f"error: {fifo}: matched by {pattern}: is a FIFO, not a regular file; tokmix reads only "
                    "regular files (move it away or narrow the pattern)")
            assert result.exit_code == 2 and one_line(result) == want
            proc = run_process("run", corpus, "--out", tmp_path / "o")  # the stage process lists them
            assert proc.returncode == 2 and proc.stderr.strip() == want
            fifo.unlink()
            fifo.symlink_to("/dev/zero")
            result = cli("plan", corpus, "--out", tmp_path / "o")
            assert one_line(result) == want.replace("a FIFO", "a character device (through a link to /dev/zero)")
        finally:
            split.write_bytes(kept)
        fifo.unlink()
        os.mkfifo(fifo)  # listed by the split file itself, as the train file of a stream
        split.write_text(json.dumps({**json.loads(kept), "edu": {
            "holdout": ["corpus/edu/part-3.parquet"], "train": ["corpus/edu/part-9.parquet"]}}))
        result = no_hang(lambda: cli("plan", corpus, "--out", tmp_path / "o"), fifo)
        assert one_line(result) == (f"error: stream edu: file {fifo}: is a FIFO, not a regular file; tokmix reads "
                                    "only regular files")
        split.write_bytes(kept)
    finally:
        fifo.unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["tokmix-state/lock", "tokmix-state/recipe.json", "tokmix-state/done.json",
                                  "train_001.bin", "tokmix-state/error.txt"])
def test_a_fifo_in_place_of_a_runs_file_hangs_no_command(corpus, out, tmp_path, name):
    """The issue's case (a FIFO as tokmix-state/lock blocked `run` and `status` forever) and the other files a
    command opens: each command returns, and one that needs the file names it in one line."""
    fifo = out / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    commands = [("status", out), ("validate", out), ("inspect", out, "--shard", "1"), ("trace", out, "--shard", "1"),
                ("export", out, "--format", "llmc", tmp_path / "llmc"), ("report", out, "--html", tmp_path / "r.html")]
    if name.startswith("tokmix-state/"):  # read by the supervisor (a shard's FIFO: the stage process remakes it)
        commands.append(("run", corpus, "--out", out))
    for command in commands:
        result = no_hang(lambda: cli(*command), fifo)  # noqa: B023 (called at once)
        text = result.stderr.strip()
        assert "Traceback" not in text and "\n" not in text, (command, text)
        if result.exit_code != 0:
            assert str(fifo) in text or str(fifo.relative_to(out)) in text, (command, text)
    if name in ("tokmix-state/lock", "tokmix-state/recipe.json"):  # both need it: both name it
        for command in (("status", out), ("run", corpus, "--out", out)):
            result = cli(*command)
            assert result.exit_code == 2 and str(fifo) in one_line(result) and "a FIFO" in one_line(result)


def test_a_fifo_named_as_the_recipe_split_file_or_tokenizer_is_named(corpus, tmp_path):
    root = tmp_path / "inputs"
    shutil.copytree(corpus.parent, root)
    recipe = root / "recipe.toml"
    for name, what in (("data/file_splits.json", "split file "), ("tokenizer/tokenizer.json", "tokenizer ")):
        path = root / name
        path.unlink()
        os.mkfifo(path)
        result = no_hang(lambda: cli("plan", recipe, "--out", tmp_path / "o"), path)  # noqa: B023
        assert one_line(result) == f"error: {what}{path}: is a FIFO, not a regular file; tokmix reads only regular " \
                                   "files"
        path.unlink()
        shutil.copy(corpus.parent / name, path)
    fifo = tmp_path / "r.toml"
    os.mkfifo(fifo)
    result = no_hang(lambda: cli("plan", fifo), fifo)
    assert one_line(result) == f"error: {fifo}: is a FIFO, not a regular file; tokmix reads only regular files"


# ---------------------------------------------------------------------------- a damaged file in every command
READERS = ("status", "validate", "inspect", "trace", "export", "report")


def _reader(command: str, out: Path, tmp_path: Path) -> list:
    return {"status": ["status", out], "validate": ["validate", out], "inspect": ["inspect", out, "--shard", "0"],
            "trace": ["trace", out, "--step", "0"], "export": ["export", out, "--format", "megatron",
                                                                tmp_path / "mega" / "data"],
            "report": ["report", out, "--html", tmp_path / "r.html"]}[command]


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "no seed":  # sealed again by someone who removed the field
        record = json.loads(data)
        record.pop("record_sha256")
        record.pop("seed")
        seal = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
        path.write_text(json.dumps({**record, "record_sha256": seal}))
    elif how == "deleted":
        path.unlink()


# file, how it is damaged, the commands that must fail naming it (the others may pass: they do not need it)
DAMAGED = [
    ("tokmix-state/recipe.json", "truncated", {"status"}),
    ("index.json", "truncated", set(READERS)),
    ("tokmix-state/expected.json", "no seed", {"validate"}),
    ("tokmix-state/expected.json", "deleted", {"validate"}),
    ("train_000.docs", "truncated", {"validate", "trace", "export"}),
    ("streams/edu/stream.json", "truncated", set()),
]


@pytest.mark.parametrize("name,how,failing", DAMAGED, ids=[f"{n}-{h}" for n, h, _ in DAMAGED])
def test_a_damaged_file_is_one_line_naming_it_in_every_command(out, tmp_path, name, how, failing):
    """The issue's case: `status` over a truncated tokmix-state/recipe.json ended in a JSONDecodeError
    traceback; expected.json deleted made `validate` pass with a note that the run predates it, and one without
    its seed gave `cannot validate ('seed')`."""
    path = out / name
    _damage(path, how)
    for command in [c for c in READERS if c in failing or c in ("status", "validate", "inspect")]:
        result = cli(*_reader(command, out, tmp_path))
        text = result.stderr.strip()
        assert "Traceback" not in text and result.exception is None or isinstance(result.exception, SystemExit), \
            (command, text, result.exception)
        if command in failing:
            assert result.exit_code in (1, 2), (command, result.stdout[-500:])
            first = text.splitlines()[0].removeprefix("error: ")
            assert first.startswith((f"{path}: ", f"{name}: ")), (command, text)
        else:
            assert "\n" not in text, (command, text)
    if name == "tokmix-state/expected.json":
        result = cli("validate", out)
        want = {"no seed": f"{path}: damaged (not the record tokmix writes: no 'seed'): the shards cannot be "
                           "checked against the units they were made of",
                "deleted": f"{path}: missing, but index.json says this run kept it (the shards' sha256 derived "
                           "from the units and the seed): the shards cannot be checked against the units they "
                           "were made of"}[how]
        assert result.exit_code == 1 and result.stderr.strip() == want


# ---------------------------------------------------------------------------- the sweep removes what tokmix recorded
def test_the_temporary_file_sweep_removes_only_what_tokmix_recorded(corpus, tmp_path):
    """The issue's case: a user's own `index.json.tmp-77777` was removed by the resume's sweep (the docs said only
    tokmix's files are). A kill inside the first shard's write leaves tokmix's own temporary file, which goes."""
    out = tmp_path / "out"
    killed = run_process("run", corpus, "--out", out, "--workers", "1", env={"TOKMIX_FAULT": "assemble:before-rename"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    own = sorted(out.glob("train_*.bin.tmp-*"))
    assert own and all((out / "tokmix-state/temporary" / p.name).is_file() for p in own)
    users = {out / "index.json.tmp-77777": b"the user's draft\n", out / "train_000.bin.tmp-4242": b"mine\n",
             out / "val_edu.bin.tmp-1": b"also mine\n"}
    for path, data in users.items():
        path.write_bytes(data)
    proc = run_process("run", corpus, "--out", out, "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert {p: p.read_bytes() for p in users} == users
    assert not any(p.exists() for p in own)
    assert cli("validate", out).exit_code == 0


# ---------------------------------------------------------------------------- a held-out file never trains
def _with_stream(corpus: Path, root: Path, files: list[str], domain: str = "dclm2", extra: str = "") -> Path:
    """The corpus's recipe (inputs copied to `root`) plus a stream of another domain reading `files`."""
    shutil.copytree(corpus.parent, root, ignore=shutil.ignore_patterns("file_splits.json"))
    text = (root / "recipe.toml").read_text().replace("share = 0.13", "share = 0.08")
    listed = ", ".join(f'"{f}"' for f in files)
    text += f'\n[streams.web2]\ndomain = "{domain}"\nshare = 0.05\nfiles = [{listed}]\n{extra}'
    (root / "recipe.toml").write_text(text)
    return root / "recipe.toml"


@pytest.mark.parametrize("case", ["named", "glob", "link", "copy", "same domain"])
def test_a_file_held_out_anywhere_is_refused_as_a_train_file_anywhere(corpus, tmp_path, case):
    """The issue's case: with decontaminate = false, a stream of domain web2 listing web's held-out file trained on
    it (its first val document verbatim in the train shards). By name, by a glob, through a link, as a copy byte
    for byte, and within one domain: plan and run refuse, naming the file and both streams."""
    root = tmp_path / "inputs"
    held = "corpus/dclm/part-3.parquet"  # the split holds out each stream's last file
    own = "corpus/edu/part-3.parquet"  # what the new stream holds out itself (edu holds it out too)
    files = {"named": [held, own], "glob": ["corpus/dclm/part-[03].parquet", own], "link": ["corpus/other/p.parquet",
             own], "copy": ["corpus/other/p.parquet", own], "same domain": [held, own]}[case]
    recipe = _with_stream(corpus, root, files, "dclm" if case == "same domain" else "dclm2",
                          f'holdout_files = ["{own}"]')
    (root / "corpus/other").mkdir()
    if case == "link":
        (root / "corpus/other/p.parquet").symlink_to(root / held)
    if case == "copy":
        shutil.copy(root / held, root / "corpus/other/p.parquet")
    result = cli("plan", recipe, "--out", tmp_path / "o")
    text = one_line(result)
    assert result.exit_code == 2 and text.startswith("error: stream ")
    trained = root / ("corpus/other/p.parquet" if case in ("link", "copy") else held)
    how = {"link": f" (the same file as {root / held})", "copy": f" (a copy of {root / held}, byte for byte)"}
    stream = "dclm" if case == "same domain" else "web2"  # (one domain: the split lists it as dclm's train file)
    assert text == (f"error: stream {stream}: trains on {trained}{how.get(case, '')}, which stream dclm holds out; a "
                    "held-out file is never trained on: take it out of one of the two (the stream's files, or the "
                    "split file)")
    if case == "named":  # the run refuses it too, before it writes a shard
        proc = run_process("run", recipe, "--out", tmp_path / "o")
        assert proc.returncode == 2 and proc.stderr.strip() == text
        assert not list((tmp_path / "o").glob("*.bin"))


def test_a_split_file_listing_a_held_out_file_as_another_domains_train_file_is_refused(corpus, tmp_path):
    root = tmp_path / "inputs"
    recipe = _with_stream(corpus, root, ["corpus/edu/part-*.parquet"])
    split = json.loads((corpus.parent / "data/file_splits.json").read_text())
    split["dclm2"] = {"holdout": ["corpus/edu/part-0.parquet"], "train": ["corpus/edu/part-3.parquet"]}
    (root / "data/file_splits.json").write_text(json.dumps(split))
    result = cli("plan", recipe, "--out", tmp_path / "o")
    assert one_line(result) == (f"error: stream edu: trains on {root / 'corpus/edu/part-0.parquet'}, which stream "
                                "web2 holds out; a held-out file is never trained on: take it out of one of the two "
                                "(the stream's files, or the split file)")


# ---------------------------------------------------------------------------- export and report keep the run's rules
def test_export_never_writes_over_a_file_it_did_not_export_nor_inside_the_run(out, tmp_path):
    """The issue's cases: export overwrote the user's tokmix_train_000.bin and an existing Megatron prefix, and,
    aimed inside the run, its shards (validate then failed)."""
    llmc, mega = tmp_path / "llmc", tmp_path / "mega"
    llmc.mkdir()
    mega.mkdir()
    (llmc / "tokmix_train_000.bin").write_bytes(b"the user's\n")
    (mega / "data.idx").write_bytes(b"the user's index\n")
    for args, target in ((["llmc", llmc], llmc / "tokmix_train_000.bin"), (["megatron", mega / "data"],
                                                                            mega / "data.idx")):
        for more in ([], ["--overwrite"]):
            result = cli("export", out, "--format", args[0], args[1], *more)
            assert result.exit_code == 2
            assert one_line(result) == f"error: {target}: exists and tokmix did not export it; export never " \
                                       "writes over it: choose another target"
    assert (llmc / "tokmix_train_000.bin").read_bytes() == b"the user's\n"
    assert (mega / "data.idx").read_bytes() == b"the user's index\n"
    link = tmp_path / "link"
    link.symlink_to(out)
    before = tree(out)
    for target in (out / "train_000", out / "sub" / "data", link / "train_001"):
        result = cli("export", out, "--format", "megatron", target)
        assert one_line(result) == (f"error: {target}.bin: inside the run's directory {out}, whose files are the "
                                    "run's: export somewhere outside it")
    result = cli("export", out, "--format", "llmc", out / "x")
    assert one_line(result).startswith(f"error: {out / 'x'}/tokmix_train_000.bin: inside the run's directory")
    assert tree(out) == before and cli("validate", out).exit_code == 0
    fresh = tmp_path / "fresh"
    assert cli("export", out, "--format", "llmc", fresh).exit_code == 0
    again = cli("export", out, "--format", "llmc", fresh)  # its own earlier export: only with --overwrite
    assert one_line(again) == (f"error: {fresh / 'tokmix_train_000.bin'}: exists (an earlier export's); run again "
                               "with --overwrite to replace it, or choose another target")
    assert cli("export", out, "--format", "llmc", fresh, "--overwrite").exit_code == 0


@pytest.mark.parametrize("name", ["train_002.bin", "val_edu.bin", "train_001.docs"])
def test_export_checks_every_shard_and_index_before_it_exports_it(out, tmp_path, name):
    """The issue's case: a shard with one bit flipped was exported without a check."""
    path = out / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    for fmt, target, made in (("megatron", tmp_path / "m" / "data", tmp_path / "m" / "data.bin"),
                              ("llmc", tmp_path / "l", tmp_path / "l" / f"tokmix_{name}")):
        if fmt == "llmc" and name.endswith(".docs"):
            continue  # llm.c's files carry no documents
        result = cli("export", out, "--format", fmt, target)
        assert result.exit_code == 2
        text = one_line(result)
        assert text.startswith(f"error: {path}: ") and "sha256" in text, text
        assert not made.exists() or (name.startswith("val_") and fmt == "megatron")
        assert not list(made.parent.glob(".*tokmix-tmp"))


def test_report_never_writes_over_the_runs_files_or_a_file_it_did_not_write(out, tmp_path):
    """The issue's case: `report --html OUT/index.json` replaced the index."""
    before = tree(out)
    for target in (out / "index.json", out / "train_000.bin", out / "tokmix-state/report.html",
                   out / "streams/edu/r.html"):
        result = cli("report", out, "--html", target)
        assert one_line(result) == (f"error: {target}: one of the run's own files or folders; write the report "
                                    f"elsewhere (default: {out / 'report.html'})")
    assert tree(out) == before
    mine = tmp_path / "mine.html"
    mine.write_text("<html>the user's</html>")
    result = cli("report", out, "--html", mine)
    assert one_line(result) == (f"error: {mine}: exists and is not a report tokmix wrote; the report is never "
                                "written over it: choose another --html")
    assert mine.read_text() == "<html>the user's</html>"
    own = tmp_path / "r.html"
    assert cli("report", out, "--html", own).exit_code == 0
    assert cli("report", out, "--html", own, "--no-scan").exit_code == 0  # its own earlier report: replaced


def test_a_finished_runs_changed_tokenizer_is_named_by_every_command(corpus, out, tmp_path):
    """The issue's case: a finished run whose tokenizer file changed was `done` for `run`, and `inspect` decoded it
    with the new tokenizer, silently. The module's tokenizer is edited (two ids swapped) and restored."""
    path = corpus.parent / "tokenizer/tokenizer.json"
    kept = path.read_bytes()
    spec = json.loads(kept)
    vocab = spec["model"]["vocab"]
    a, b = (k for k, i in vocab.items() if i in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    try:
        path.write_text(json.dumps(spec))
        recorded, now = hashlib.sha256(kept).hexdigest()[:12], hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        line = (f"tokenizer {path}: changed since this run wrote its shards (sha256 {recorded}... in index.json, now "
                f"{now}...); its ids are not the shards' ids: restore it")
        result = cli("inspect", out, "--shard", "0")
        assert result.exit_code == 2 and one_line(result) == f"error: {line}"
        result = cli("validate", out)
        assert result.exit_code == 1 and result.stderr.strip() == line
        for command in (["trace", out, "--step", "0"], ["report", out, "--html", tmp_path / "r.html", "--no-scan"]):
            result = cli(*command)
            assert result.exit_code == 0 and result.stderr.strip() == f"warning: {line}", command
        assert line in " ".join(cli("status", out).stdout.split())
        proc = run_process("run", corpus, "--out", out)
        assert proc.returncode == 2 and proc.stderr.strip() == (
            f"error: tokenizer {path}: changed since this run started (sha256 {recorded}..., now {now}...); what is "
            "already written holds the first one's ids: restore it, or use --restart to start over")
    finally:
        path.write_bytes(kept)
    assert cli("validate", out).exit_code == 0
