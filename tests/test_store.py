"""Output straight to an object store: a real S3 server (moto's, on localhost, started once for this module)
reached through s3fs, as a bucket on AWS is, and a GCS one (gcp-storage-emulator's) through gcsfs. Workers
write units and shards to it under their final names, each committed by a record written after it; a run
killed inside an upload resumes from the committed records, and the result is byte for byte what a local run
writes; `tokmix validate` checks it on the store."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import tokmix
from tests.pausing import resume, wait_for_pause
from tokmix.errors import TokmixError

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
boto3 = pytest.importorskip("boto3", reason="moto[server] is not installed (the test extra)")

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "tokmix-test"
STORE_CACHE = f"s3://{BUCKET}/token-cache"


@contextlib.contextmanager
def configured(env: dict[str, str], protocol: str, conf: dict):
    """A store's endpoint and credentials where fsspec finds them: in this process (fsspec's config) and in the
    runs it starts (their environment); put back as they were afterwards."""
    import fsspec

    saved_env, saved_conf = {k: os.environ.get(k) for k in env}, fsspec.config.conf.get(protocol)
    os.environ.update(env)
    fsspec.config.conf[protocol] = conf
    try:
        yield
    finally:
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        fsspec.config.conf.pop(protocol, None)
        if saved_conf is not None:
            fsspec.config.conf[protocol] = saved_conf


@pytest.fixture(scope="module")
def s3():
    """A real S3 API on 127.0.0.1 (moto's server in a thread of this process) with one bucket."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "FSSPEC_S3_ENDPOINT_URL": endpoint}
    try:
        with configured(env, "s3", {"endpoint_url": endpoint}):
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                                  aws_secret_access_key="testing")
            client.create_bucket(Bucket=BUCKET)
            yield client
    finally:
        server.stop()


def objects(client, prefix: str) -> dict[str, bytes]:
    """Every object under the prefix, by its name below it, read with boto3 (not through tokmix's s3fs)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix + "/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return {k[len(prefix) + 1:]: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def same_as_local(found: dict[str, bytes], local: Path) -> None:
    """The store holds every token file and provenance index of the local run, byte for byte, and its index."""
    shards = sorted(p.name for p in [*local.glob("*.bin"), *local.glob("*.docs")])
    assert sorted(n for n in found if n.endswith((".bin", ".docs")) and "/" not in n) == shards
    for name in shards:
        assert found[name] == (local / name).read_bytes(), name
    index, want = json.loads(found["index.json"]), json.loads((local / "index.json").read_text())
    assert index["shards"] == want["shards"] and index["val"] == want["val"]


def cli(*args: str, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_UNIT_BYTES": "20000"}  # several units per file
    if fault:
        env["TOKMIX_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "tokmix.cli", *args], capture_output=True, text=True, env=env,
                          start_new_session=True)


@pytest.fixture(scope="module")
def whole(s3, finished_run, tmp_path_factory) -> tuple[str, Path]:
    """A run of the session's test recipe to the store, uninterrupted: its URL and local working folder."""
    url, work = f"s3://{BUCKET}/whole", tmp_path_factory.mktemp("whole") / "work"
    # its workers fill a token cache on the store from the units they write there (tests the store cache below)
    tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), url, work=work, workers=2, cache=STORE_CACHE)
    return url, work


def test_a_run_to_s3_writes_what_a_local_run_writes_with_nothing_staged_locally(s3, whole, finished_run):
    _, work = whole
    found = objects(s3, "whole")
    same_as_local(found, finished_run)
    assert not [n for n in found if n.startswith("streams/")], "the units are removed once the run is valid"
    assert not list(work.rglob("*.bin")) and not list(work.rglob("*.tok")), "no token file is kept locally"
    assert (work / "tokmix-state" / "lock").exists(), "the run's lock is the kernel's, in the local folder"


def test_a_token_cache_on_the_store_gives_a_local_run_every_unit_checked_and_the_same_bytes(
        s3, whole, finished_run, tmp_path):
    """The cache `whole` filled on the store (tokmix.cache): every entry whole (its objects' sha256 against its
    record, read back through boto3's view of the bucket too), and a local run of the recipe takes every unit
    from it and writes the local run's bytes; an entry whose object is damaged on the store is found, removed
    and made again."""
    from tokmix.cache import UnitCache

    cache = UnitCache(STORE_CACHE)
    whole_entries, problems = cache.verify()
    stored = objects(s3, "token-cache")
    assert problems == [] and whole_entries == sum(1 for n in stored if n.endswith("/entry.json")) > 4
    first = next(json.loads(data) for n, data in sorted(stored.items())  # a unit every run uses
                 if n.endswith("/entry.json") and json.loads(data)["parts"].get("unit") == "000000")
    victim = f"entries/{first['key'][:2]}/{first['key']}/{first['files']['tok']}"
    s3.put_object(Bucket=BUCKET, Key=f"token-cache/{victim}", Body=stored[victim][:-2])  # truncated
    index = tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), tmp_path / "out", workers=2,
                       cache=STORE_CACHE)
    assert index["cache"]["units_from_cache"] == index["cache"]["units"] - 1
    assert index["cache"]["holdouts"]["tokens_tokenized"] == 0 < index["cache"]["holdouts"]["tokens_from_cache"]
    same_as_local(objects_of(tmp_path / "out"), finished_run)
    assert cache.verify() == (whole_entries, [])


def test_a_unit_goes_on_from_a_partial_entry_on_the_store(s3, finished_run, tmp_path, monkeypatch):
    """A partial entry (a stream's last unit) on the store: a unit that needs more of it takes its tokens,
    checked, and encodes only the rest (tests/test_cache.py)."""
    from tests.test_cache import goes_on_from_a_partial_entry

    goes_on_from_a_partial_entry(finished_run.parent, f"s3://{BUCKET}/tail-cache", tmp_path, monkeypatch, (3,))


def objects_of(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_a_run_killed_inside_uploads_resumes_from_its_records_to_the_same_bytes(s3, finished_run, tmp_path):
    recipe, url, work = finished_run.parent / "recipe.toml", f"s3://{BUCKET}/killed", tmp_path / "work"
    run = ("run", str(recipe), "--out", url, "--work", str(work), "--workers", "2")
    # every token of a unit handed to its upload, which has not completed: the third unit's
    first = cli(*run, fault="streams:unit-before-rename:3")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    units = objects(s3, "killed")
    records = [n for n in units if n.startswith("streams/") and n.endswith(".json") and "/units/" in n]
    assert records, "units committed before the kill are on the store"
    for name in records:  # a record is written after the objects it commits
        assert name[:-5] + ".tok" in units and name[:-5] + ".len" in units
    assert not [n for n in units if n.startswith("train_")] and "index.json" not in units
    # half of a batch of a shard's tokens written into its upload
    second = cli(*run, fault="assemble:mid-write:2")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert "already committed" in second.stdout, "the resume lists the committed units on the store"
    assert "index.json" not in objects(s3, "killed"), "index.json comes last"
    # validated, every shard on the store, index.json not yet
    third = cli(*run, fault="publish:before-index:1")
    assert third.returncode == -signal.SIGKILL, third.stderr[-2000:]
    shards = [n for n in objects(s3, "killed") if n.startswith("train_") and n.endswith(".bin")]
    assert len(shards) == len(list(finished_run.glob("train_*.bin"))) and "index.json" not in objects(s3, "killed")
    last = cli(*run)
    assert last.returncode == 0 and "already complete" in last.stdout, last.stdout + last.stderr[-2000:]
    same_as_local(objects(s3, "killed"), finished_run)
    checked = cli("validate", url)
    assert checked.returncode == 0 and "valid" in checked.stdout, checked.stdout + checked.stderr


def test_a_prefix_holding_objects_tokmix_did_not_write_is_refused(s3, finished_run, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="theirs/model.safetensors", Body=b"not tokmix's")
    with pytest.raises(TokmixError, match=r"s3://tokmix-test/theirs: not empty and not a tokmix run .*model"):
        tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), f"s3://{BUCKET}/theirs",
                   work=tmp_path / "work", workers=1)
    assert objects(s3, "theirs") == {"model.safetensors": b"not tokmix's"}


def test_a_missing_bucket_is_one_line_naming_the_output(s3, finished_run, tmp_path):
    with pytest.raises(TokmixError, match=r"^output s3://no-such-bucket/run: bucket s3://no-such-bucket does not "):
        tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), "s3://no-such-bucket/run",
                   work=tmp_path / "work", workers=1)


def test_a_run_from_another_working_folder_or_with_another_recipe_is_refused(s3, whole, finished_run, tmp_path):
    url, work = whole
    recipe = tokmix.load_recipe(finished_run.parent / "recipe.toml")
    before = objects(s3, "whole")
    with pytest.raises(TokmixError, match=f"written by the tokmix run working in {work} .*--break-lock"):
        tokmix.run(recipe, url, work=tmp_path / "elsewhere", workers=1)  # its lock cannot see the other's
    with pytest.raises(TokmixError, match="started with another recipe.*blocks"):  # its own record of it is lost
        tokmix.run(recipe, url, work=tmp_path / "elsewhere", workers=1, break_lock=True, blocks=300)
    assert objects(s3, "whole") == before


def test_working_folders_racing_on_one_prefix_cannot_both_write(s3, finished_run, tmp_path):
    """Issue 31: two --work folders started at the same moment on one fresh prefix both ran (each read the
    store's record of its working folder before the other wrote it). Four runs started at once, each killed at
    its first unit: the store's create-if-absent lets exactly one claim the prefix; the others are refused."""
    recipe, url = finished_run.parent / "recipe.toml", f"s3://{BUCKET}/raced"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKMIX_FAULT": "streams:after-unit:1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", url, "--work",
                               str(tmp_path / f"work{i}"), "--workers", "1"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, start_new_session=True) for i in range(4)]
    results = [(p.wait(), p.communicate()[1]) for p in procs]
    wrote = [i for i, (code, _) in enumerate(results) if code == -signal.SIGKILL]
    assert len(wrote) == 1, results
    owner = json.loads(objects(s3, "raced")["tokmix-state/run.json"])["work"]
    assert owner == str(tmp_path / f"work{wrote[0]}")
    for i, (code, stderr) in enumerate(results):
        if i not in wrote:
            assert code == 2 and stderr.strip().startswith(f"error: {url}: written by the tokmix run working in "
                                                           f"{owner} on host "), stderr


def test_a_working_folder_belongs_to_one_output(s3, whole, finished_run, tmp_path):
    """Issue 31: --work with a local --out was silently ignored, and --work pointed at a finished local run's
    folder was accepted and its bookkeeping rewritten."""
    recipe = tokmix.load_recipe(finished_run.parent / "recipe.toml")
    with pytest.raises(TokmixError, match=r"^--work .*: only for an output on an object store \(s3://, gs://\); "
                                          r"a local --out keeps its lock and bookkeeping in .*tokmix-state: "
                                          r"drop --work$"):
        tokmix.run(recipe, tmp_path / "local", work=tmp_path / "w", workers=1)
    assert not (tmp_path / "local").exists() and not (tmp_path / "w").exists()
    local = tmp_path / "finished"
    shutil.copytree(finished_run, local)
    before = {p: p.read_bytes() for p in local.rglob("*") if p.is_file()}
    with pytest.raises(TokmixError, match=f"^--work {local}: the output directory of a local tokmix run"):
        tokmix.run(recipe, f"s3://{BUCKET}/elsewhere", work=local, workers=1)
    assert {p: p.read_bytes() for p in local.rglob("*") if p.is_file()} == before
    _, work = whole
    with pytest.raises(TokmixError, match=f"^--work {work}: the working folder of the run writing "
                                          f"s3://{BUCKET}/whole; each output needs its own"):
        tokmix.run(recipe, f"s3://{BUCKET}/another", work=work, workers=1)
    assert not objects(s3, "another")


def test_a_store_run_is_readable_by_every_command_and_the_loader(s3, whole, finished_run, tmp_path):
    """Issue 31: trace, inspect, status, report, export and TrainBlocks("s3://...") turned the URL into a local path
    `s3:/...` and said "not a tokmix output directory". Each reads the store through fsspec and says what it says
    of the local run of the same recipe; the loader reads each step's blocks by ranged reads."""
    from typer.testing import CliRunner

    from tokmix.cli import app
    from tokmix.data import TrainBlocks

    url, work = whole

    def cli_in(*args):
        result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (args, result.stdout[-1000:], result.stderr[-1000:])
        return result.stdout

    for args in (["inspect", "--shard", "1", "--block", "2"], ["trace", "--step", "3", "--json"],
                 ["inspect", "--holdout", "edu", "--block", "1"]):
        assert cli_in(args[0], url, *args[1:]) == cli_in(args[0], finished_run, *args[1:]), args
    assert cli_in("validate", url).strip().endswith("valid (4 shard(s), 352 blocks, 3 holdout(s))") \
        and "note:" not in cli_in("validate", url), "the kept digests are published beside the shards"
    moved = tmp_path / "work-elsewhere"
    work.rename(moved)  # read from the store alone, as from another machine
    try:
        assert "complete and validated" in cli_in("status", url)
        cli_in("report", url, "--html", tmp_path / "r.html")
        assert (tmp_path / "r.html").read_text().count("<img") >= 1
        cli_in("export", url, "--format", "llmc", tmp_path / "s3")
        cli_in("export", finished_run, "--format", "llmc", tmp_path / "local")
        for f in (tmp_path / "local").glob("tokmix_*.bin"):
            assert (tmp_path / "s3" / f.name).read_bytes() == f.read_bytes(), f.name
        remote, local = TrainBlocks(url), TrainBlocks(finished_run)
        for step in range(remote.steps):
            assert all((a == b).all() for a, b in zip(remote.batch(step), local.batch(step)))
            assert (remote.segments(step).cu_seqlens == local.segments(step).cu_seqlens).all()
    finally:
        moved.rename(work)


def test_store_failures_are_one_line_saying_what_is_wrong(s3, finished_run, tmp_path):
    """Issue 31: missing credentials were reported as "bucket does not exist"."""
    recipe = finished_run.parent / "recipe.toml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(key)
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", f"s3://{BUCKET}/creds",
                           "--work", str(tmp_path / "w")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: output s3://{BUCKET}/creds: the store refused the credentials (NoCredentialsError: Unable to locate "
        "credentials): check them (AWS_* / GOOGLE_APPLICATION_CREDENTIALS, or fsspec's config); nothing was written")


def test_a_store_that_goes_away_mid_run_is_one_line_and_the_working_folder_is_kept(finished_run, tmp_path):
    """Issue 31: a store lost mid-run ended in "internal error: EndpointConnectionError". A run of its own S3
    server pauses once its first unit is on the store (tokmix.faults' pause, told through a FIFO); the server is
    stopped, the run goes on (`hold`) and fails in one line naming the output and the reason; the local working folder
    (its lock and records) is kept for the resume."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="lost")
        fifo, work, url = tmp_path / "paused", tmp_path / "work", "s3://lost/run"
        os.mkfifo(fifo)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FSSPEC_S3_ENDPOINT_URL": endpoint,
               "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_MAX_ATTEMPTS": "1", "TOKMIX_FAULT": "streams:after-unit:1:hold", "TOKMIX_PAUSE_FIFO": str(fifo)}
        proc = subprocess.Popen([sys.executable, "-m", "tokmix.cli", "run", str(finished_run.parent / "recipe.toml"),
                                 "--out", url, "--work", str(work), "--workers", "1"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            assert wait_for_pause(fifo, lambda: proc.poll() is None, 300), proc.stderr.read()[-2000:]
            server.stop()
            resume(fifo)
            stderr = proc.communicate(timeout=300)[1]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        server.stop()
    last = stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in stderr, stderr[-2000:]
    assert last.startswith(f"error: output {url}: the store is unreachable (") and last.endswith(
        "; committed work is kept: run the same command again once it is fixed"), last
    assert (work / "tokmix-state" / "output.json").exists() and (work / "tokmix-state" / "lock").exists()


def test_file_urls_are_local_paths(finished_run, tmp_path):
    tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), f"file://{tmp_path}/out", workers=1)
    assert (tmp_path / "out" / "index.json").exists() and not list(tmp_path.glob("*/tokmix-state/run.json"))


@pytest.mark.parametrize("url", ["memory://bucket/run", "simplecache::s3://bucket/run"])
def test_an_output_url_that_workers_cannot_share_is_refused(finished_run, tmp_path, url):
    with pytest.raises(TokmixError, match=f"output {url}: "):
        tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), url, work=tmp_path, workers=1)


@pytest.fixture(scope="module")
def gcs():
    """The GCS JSON API on 127.0.0.1 (gcp-storage-emulator, in a thread of this process) with one bucket, and a
    gcsfs client of its own. gcsfs's experimental zonal/HNS probe (gRPC) is off: the emulator speaks HTTP only."""
    emulator = pytest.importorskip("gcp_storage_emulator.server", reason="gcp-storage-emulator is not installed "
                                                                         "(the test extra)")
    server = emulator.create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
    env = {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
           "FSSPEC_GCS_TOKEN": "anon", "FSSPEC_GCS_PROJECT": "test"}
    try:
        with configured(env, "gcs", {"token": "anon", "project": "test"}):
            gcsfs = pytest.importorskip("gcsfs", reason="gcsfs is not installed (the test extra)")
            yield gcsfs.GCSFileSystem(token="anon", project="test", endpoint_url=endpoint, skip_instance_cache=True)
    finally:
        server.stop()


def test_a_run_to_gcs_writes_what_a_local_run_writes(gcs, finished_run, tmp_path):
    url = f"gs://{BUCKET}/run"
    tokmix.run(tokmix.load_recipe(finished_run.parent / "recipe.toml"), url, work=tmp_path / "work", workers=2)
    gcs.invalidate_cache()
    found = {p.removeprefix(f"{BUCKET}/run/"): gcs.cat_file(p) for p in gcs.find(f"{BUCKET}/run")}
    same_as_local(found, finished_run)
    assert not [n for n in found if n.startswith("streams/")]
    assert not list((tmp_path / "work").rglob("*.bin")), "written straight to the store, not staged locally"
    checked = cli("validate", url)
    assert checked.returncode == 0 and "valid" in checked.stdout, checked.stdout + checked.stderr


def test_a_built_benchmark_set_kept_in_a_cache_on_the_store(s3, tmp_path):
    """The benchmark set cache on the store (tokmix.stages.decontam): HumanEval's set built and kept (its
    arrays uploaded, the entry's record last; by the function prepare_set hands `later`, as a run does beside
    its streams stage), taken by the next preparation (each object's sha256 checked) with the fresh build's
    arrays and record, and an object truncated on the store said and built again."""
    from tests.test_decontam import HUMANEVAL, set_recipe
    from tokmix.cache import UnitCache
    from tokmix.stages.decontam import prepare_set, set_files

    cache = f"s3://{BUCKET}/set-cache"
    recipe = set_recipe(tmp_path, [HUMANEVAL], ["prompt", "canonical_solution"], "task_id")
    said: list[str] = []
    prepare_set(recipe, tmp_path / "fresh", [], said.append)
    later: list = []  # a run uploads a set it built beside its streams stage (pipeline.run_pipeline)
    prepare_set(recipe, tmp_path / "cold", [], said.append, cache=cache, later=later.append)
    assert not any("kept in the token cache" in line for line in said) and not objects(s3, "set-cache")
    later.pop()()
    assert any("kept in the token cache" in line for line in said)
    for name in ("warm", "again"):
        if name == "again":
            victim = next(k for k in objects(s3, "set-cache") if k.endswith(".grams"))
            s3.put_object(Bucket=BUCKET, Key=f"set-cache/{victim}", Body=objects(s3, "set-cache")[victim][:-8])
        said.clear()
        prepare_set(recipe, tmp_path / name, [], said.append, cache=cache)
        if name == "warm":
            assert any("taken from the token cache" in line for line in said), said
        else:
            assert any("differs from its record); removed, built again" in line for line in said), said
            assert any("kept in the token cache" in line for line in said), said
        for kind, path in set_files(tmp_path / "fresh").items():
            assert set_files(tmp_path / name)[kind].read_bytes() == path.read_bytes(), (name, kind)
        assert (tmp_path / name / "set.json").read_bytes() == (tmp_path / "fresh" / "set.json").read_bytes()
    assert UnitCache(cache).verify()[1] == []
