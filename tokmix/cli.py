"""The `tokmix` command: parse arguments, call the Python API, print. A user-facing failure is one line
on stderr and a non-zero exit; --debug shows the traceback."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from tokmix.errors import TokmixError, os_error_message
from tokmix.format.records import Index
from tokmix.store import is_url
from tokmix.text import size_bytes


class _FlagsShownAsFlags:
    """Typer's help shows each option's type, a flag's as <bool>, which reads as if the flag took a value
    (`--debug true` then fails); a flag is shown bare. Every command gets this, the ones added later too."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        return params


class _Command(_FlagsShownAsFlags, TyperCommand):
    pass


class _Group(_FlagsShownAsFlags, TyperGroup):
    pass


class _App(typer.Typer):
    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)


# True in the `tokmix` command itself (main()), whose supervisor process is tokmix's alone; `app` invoked inside
# another program (typer's test runner, a notebook) shares that program's process, whose memory is not the run's
_AS_COMMAND = False

app = _App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, cls=_Group,
           help="Turn raw text and code into token shards at exact mixture shares.")
# a log file or CI gets tables 140 columns wide rather than rich's default of 80. No markup: messages hold the
# user's paths and field names, whose square brackets are text ("data [v2]", text_field = "[/]"); styles are
# given as Text objects
console = Console(width=None if sys.stdout.isatty() else 140, markup=False)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 400, markup=False)

def parse_size(text: str, option: str) -> int:
    """'1GiB', '512M', '2g', '1073741824' -> bytes (binary units)."""
    try:
        return size_bytes(text)
    except ValueError:
        raise TokmixError(f"{option} {text!r}: not a size such as 1GiB or 512MiB") from None


def _fail(e: Exception, debug: bool) -> None:
    """One line on stderr, whatever the message holds; the traceback first with --debug."""
    if debug:
        err.print_exception()
    message = os_error_message(e) if isinstance(e, OSError) else str(e)
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _print_version(value: bool) -> None:
    if value:
        from tokmix import __version__

        console.print(f"tokmix {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print tokmix's version and exit"),
) -> None:
    pass  # the options of `tokmix` itself, before a command; the help text is the Typer's


def warn_if_tokenizer_changed(out: str | Path) -> None:
    """Commands that read a finished run without decoding it say, in one line, when its tokenizer file is not the
    one its shards were made with (inspect, which decodes, refuses)."""
    from tokmix.shards import read_index, tokenizer_change

    if (changed := tokenizer_change(out, read_index(out))) is not None:
        err.print(Text.assemble(("warning:", "bold red"), " ", changed), highlight=False, soft_wrap=True)


def print_summary(out: Path, index: Index) -> None:
    from tokmix.summary import holdout_table, mix_table, timing_table

    console.print(mix_table(index))
    console.print(holdout_table(index))
    from tokmix.shards import DamagedFile, Layout, read_json

    try:
        timings = read_json(Layout(out).timings)
    except DamagedFile:
        timings = None  # a table the summary can do without
    if timings:
        console.print(timing_table(timings, index.total.tokens))


@app.command()
def run(
    recipe: Path = typer.Argument(..., help="recipe TOML file"),
    out: str | None = typer.Option(None, "--out", "-o", help="output directory or URL (default: <recipe>-out)"),
    workers: int | None = typer.Option(None, "--workers", "-w", help="threads (Ray: tasks); default: cores"),
    blocks: int | None = typer.Option(None, help="train blocks (overrides the recipe)"),
    keep_streams: bool = typer.Option(False, "--keep-streams", help="keep the intermediates after validation"),
    backend: str | None = typer.Option(None, "--tokenizer-backend", help="auto | fastokens | tiktoken | "
                                                                         "sentencepiece | hf (overrides the recipe)"),
    max_memory: str = typer.Option("1GiB", help="memory budget of the whole process tree"),
    mirror: list[str] = typer.Option([], help="PREFIX=LOCAL_DIR: read files under PREFIX from a local copy"),
    restart: bool = typer.Option(False, "--restart", help="discard this directory's earlier run and start over"),
    break_lock: bool = typer.Option(False, "--break-lock", help="take over the lock of a run on another host that "
                                                                "is known to have stopped"),
    executor: str = typer.Option("local", "--executor", help="local (threads of one process) | processes (one per "
                                                       "worker: for many cores) | ray"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to use with --executor ray "
                                                                       "(default: RAY_ADDRESS, else a local one)"),
    work: Path | None = typer.Option(None, "--work", help="when --out is a URL: the local folder of the run's lock "
                                                          "and bookkeeping (default: under ~/.cache/tokmix)"),
    cache: str | None = typer.Option(None, "--cache", help="the token cache shared by runs: a folder or URL "
                                                           "(default: TOKMIX_CACHE, else ~/.cache/tokmix/units)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="tokenize every unit and build the benchmark set, "
                                                            "neither using nor filling the token cache"),
    cache_size: str | None = typer.Option(None, "--cache-size", help="the token cache's cap (default: "
                                                                     "TOKMIX_CACHE_SIZE, else 50GiB or a quarter of "
                                                                     "its disk)"),
    log_every: float = typer.Option(30.0, "--log-every", help="without a terminal: a progress line per stage and "
                                                              "stream every SECONDS"),
    log_format: str = typer.Option("text", "--log-format", help="text | json (JSON lines, for a log collector)"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Run every stage of RECIPE that is not done yet: holdout, streams, assemble, validate.

    --out may be a local path or an fsspec URL (s3://bucket/run, gs://..., file://...).
    """
    from tokmix.process import RunOptions
    from tokmix.recipe import load_recipe
    from tokmix.runner import run as run_recipe

    out_url = out if out and "://" in out else None
    out = Path(out) if out and not out_url else Path(f"{recipe.stem}-out")
    try:
        options = RunOptions(max_memory=parse_size(max_memory, "--max-memory"), keep_streams=keep_streams,
                             mirrors=mirror, executor=executor, ray_address=ray_address, debug=debug,
                             guard_counts_supervisor=_AS_COMMAND, log_seconds=log_every, log_format=log_format)
        if workers is not None:
            options.workers = workers
        from tokmix.cache import resolve as resolve_cache

        options.cache = resolve_cache(cache, no_cache)
        options.cache_size = parse_size(cache_size, "--cache-size") if cache_size else None
        t0 = time.perf_counter()
        index = run_recipe(load_recipe(recipe), out_url or out, blocks=blocks, backend=backend, restart=restart,
                           work=work, options=options, break_lock=break_lock)
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    except KeyboardInterrupt:
        err.print(f"interrupted; committed work is kept. Resume with the same command: tokmix run {recipe} "
                  f"--out {out_url or out}")
        raise typer.Exit(130) from None
    from tokmix.store import work_dir

    seconds, index = time.perf_counter() - t0, Index.from_json(index)
    if log_format == "json":  # the log collector gets JSON lines only: the run's outcome as one more
        from tokmix.process import log

        print(log.line(f"done in {seconds:,.1f}s -> {out_url or out}", "done", seconds=round(seconds, 3),
                       out=str(out_url or out), tokens=index.total.tokens), flush=True)
        return
    print_summary(work_dir(out_url, work) if out_url else out, index)
    console.print(f"done in {seconds:,.1f}s -> {out_url or out}")


@app.command()
def validate(out: str = typer.Argument(..., help="output directory or URL (s3://bucket/run, gs://...)"),
             debug: bool = typer.Option(False, "--debug")) -> None:
    """Check an output directory: sizes, ids, overlaps, checksums, holdouts, shares."""
    from tokmix.shards import read_index
    from tokmix.stages.validate import derivation_note, share_warnings, validate_dir
    from tokmix.tokenizer import tokenizer_recheck

    try:
        problems = validate_dir(out)
        problem, tokenizer_note = tokenizer_recheck(out, read_index(out)) if not problems else (None, None)
    except TokmixError as e:  # a file that is not what it should be (a FIFO in a shard's place, ...), named
        _fail(e, debug)
    except (OSError, KeyError, ValueError) as e:
        _fail(TokmixError(f"{out}: cannot validate ({e})"), debug)
    problems += [problem] if problem else []
    for problem in problems:
        err.print(problem, highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)
    index = read_index(out)
    for warning in share_warnings(index):
        console.print(f"warning: {warning}")
    if (note := derivation_note(out)) is not None:
        console.print(note)
    if tokenizer_note is not None:
        console.print(tokenizer_note)
    console.print(f"{out}: valid ({len(index.shards)} shard(s), {index.blocks:,} blocks, "
                  f"{len(index.val)} holdout(s))")


@app.command()
def demo(
    out: Path = typer.Option(Path(tempfile.gettempdir()) / "tokmix-demo", "--out", "-o",
                             help="where the corpus and the run go (outside any repository by default)"),
    workers: int | None = typer.Option(None, "--workers", "-w"),
    scale: float = typer.Option(1.0, "--scale", help="corpus size as a fraction of the default (~8.6 MB of text)"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Build a small corpus from this machine's Python installation, train a tokenizer, run every stage."""
    from tokmix.demo import build_demo_corpus
    from tokmix.process import RunOptions
    from tokmix.recipe import load_recipe
    from tokmix.runner import run as run_recipe

    try:
        t0 = time.perf_counter()
        recipe_path = build_demo_corpus(out / "corpus", scale)
        console.print(f"demo corpus in {out / 'corpus'} ({time.perf_counter() - t0:.1f}s); recipe {recipe_path}")
        options = RunOptions(debug=debug)
        if workers is not None:
            options.workers = workers
        index = run_recipe(load_recipe(recipe_path), out / "run", options=options)
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    print_summary(out / "run", Index.from_json(index))
    console.print(f"demo done in {time.perf_counter() - t0:,.1f}s -> {out / 'run'}")


@app.command()
def export(
    out: str = typer.Argument(..., help="tokmix output directory or URL (s3://bucket/run, gs://...)"),
    fmt: str = typer.Option(..., "--format", "-f", help="megatron | llmc"),
    dest: Path = typer.Argument(..., help="megatron: output prefix; llmc: output directory"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the files an earlier export wrote there "
                                                              "(never a file tokmix did not export)"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Export the shards for another trainer: Megatron-LM indexed dataset or llm.c shards.

    Every shard and holdout is checked against its sha256 in index.json as it is read; nothing is written inside
    the run's directory or over a file tokmix did not export (tokmix-export.json beside them names those).
    """
    from tokmix.export import export as export_run

    try:
        written = export_run(out, fmt, dest, overwrite=overwrite)
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    for path in written or []:
        console.print(str(path))


@app.command()
def plan(
    recipe: Path = typer.Argument(..., help="recipe TOML file"),
    out: Path | None = typer.Option(None, "--out", "-o", help="output directory (default: <recipe>-out)"),
    blocks: int | None = typer.Option(None, help="train blocks (overrides the recipe)"),
    mirror: list[str] = typer.Option([], help="PREFIX=LOCAL_DIR: read files under PREFIX from a local copy"),
    sample: str = typer.Option("1MiB", help="text tokenized per stream (train and holdout) for the estimate"),
    cache: str | None = typer.Option(None, "--cache", help="the token cache to count (default: TOKMIX_CACHE, else "
                                                           "~/.cache/tokmix/units)"),
    no_cache: bool = typer.Option(False, "--no-cache", help="do not look at the token cache"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Show what a run of RECIPE would do and whether its sources suffice, in seconds (exit 1 if not).

    Files, budgets, shards, holdouts, disk space, and each stream's token supply estimated from a tokenized
    sample. Exits 1 when a stream is likely to run short, a holdout cannot be filled or the disk is too small.
    """
    from tokmix.plan import make_plan, render_plan
    from tokmix.recipe import load_recipe

    out = out or Path(f"{recipe.stem}-out")
    try:
        from tokmix.cache import resolve as resolve_cache

        result = make_plan(load_recipe(recipe).with_blocks(blocks), mirror, out=out,
                           sample_bytes=parse_size(sample, "--sample"), cache=resolve_cache(cache, no_cache))
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    console.print(render_plan(result))
    if not result.ok:
        raise typer.Exit(1)


@app.command()
def status(out: str = typer.Argument(..., help="output directory or URL (s3://bucket/run, gs://...)"),
           debug: bool = typer.Option(False, "--debug")) -> None:
    """What a run directory holds and what remains, from its files alone (safe while a run writes)."""
    from tokmix.status import render_status
    from tokmix.status import status as run_status

    try:
        console.print(render_status(run_status(out)))
    except (TokmixError, OSError) as e:
        _fail(e, debug)


@app.command()
def inspect(
    out: str = typer.Argument(..., help="output directory (or URL: s3://bucket/run, gs://...) of a finished run"),
    shard: int | None = typer.Option(None, "--shard", "-s", help="decode a block of train shard K (with --block)"),
    block: int = typer.Option(0, "--block", "-b", help="block J of the shard (or window J of --holdout)"),
    holdout: str | None = typer.Option(None, "--holdout", help="decode eval window --block of this holdout"),
    contaminated: bool = typer.Option(False, "--contamination",
                                      help="list the benchmark items found and the training documents they took"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Show a finished run's tables, or decode one block with its document starts marked.

    Without options: the mix (requested vs realized shares), the holdouts and the shards with checksums.
    --shard K --block J: block J of train shard K decoded to text, each <|endoftext|> shown as ⟦doc⟧;
    --holdout DOMAIN --block J: eval window J of that holdout.
    --contamination: each benchmark item found ([decontaminate]) and where: the documents not in the shards.
    """
    from tokmix.inspect import contamination, read_block, read_window, render_block, summary

    try:
        if contaminated:
            console.print(contamination(out))
        elif shard is not None:
            console.print(render_block(read_block(out, shard, block)))
        elif holdout is not None:
            console.print(render_block(read_window(out, holdout, block)))
        else:
            console.print(summary(out))
    except (TokmixError, OSError) as e:
        _fail(e, debug)


@app.command()
def trace(
    out: str = typer.Argument(..., help="output directory (or URL: s3://bucket/run, gs://...) of a finished run"),
    step: int | None = typer.Option(None, "--step", help="the blocks of training step N (see --rank)"),
    rank: int = typer.Option(0, "--rank", help="with --step: this rank's blocks"),
    world_size: int = typer.Option(1, "--world-size", help="with --step: ranks sharing each step"),
    skipped: int = typer.Option(0, "--skipped", help="with --step: steps the loader skipped before (NaN guard)"),
    shard: int | None = typer.Option(None, "--shard", "-s", help="block --block of train shard K"),
    block: int = typer.Option(0, "--block", "-b", help="with --shard: block J of the shard"),
    token: int | None = typer.Option(None, "--token", help="the block of token T of the train stream"),
    doc_id: str | None = typer.Option(None, "--id", help="the document(s) whose own id is ID ([streams.X] id_field): "
                                                         "where they are, their blocks and steps"),
    source: str | None = typer.Option(None, "--source", help="the document at FILE:row N or FILE:line N of a source "
                                                             "(as trace and inspect print it): where it is in the "
                                                             "run, or which benchmark items took it"),
    text: bool = typer.Option(False, "--text", help="read each document again from its source, check it against "
                                                    "its recorded CRC-32 and show its first characters"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (one object per block) for scripts"),
    mirror: list[str] = typer.Option([], help="PREFIX=LOCAL_DIR: with --text, read files under PREFIX from a "
                                              "local copy"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Which documents a training step, a block or a token came from: stream, file:row (or :line), text
    checksum and tokens in the block, from the run's provenance index.
    """
    import json

    from tokmix.trace import (
        find_id,
        find_source,
        render_found,
        render_source,
        render_summary,
        render_trace,
        shard_block,
        step_blocks,
        step_phase,
        step_summary,
        token_block,
        trace_blocks,
    )

    try:
        if sum(x is not None for x in (step, shard, token, doc_id, source)) != 1:
            raise TokmixError("name one of --step N, --shard K --block J, --token T, --id ID or --source WHERE")
        if source is not None:
            where = find_source(out, source)
            if as_json:
                print(json.dumps(where.to_json(), indent=1))
            else:
                console.print(*render_source(where))
            return
        if doc_id is not None:
            found = find_id(out, doc_id)
            if as_json:
                print(json.dumps([d.to_json() for d in found], indent=1))
            else:
                console.print(render_found(found))
            return
        marked, phase = None, None
        if step is not None:
            blocks = step_blocks(out, step, rank, world_size, skipped)
            phase = step_phase(out, step)
        elif token is not None:
            first, marked = token_block(out, token)
            blocks = [first]
        else:
            blocks = [shard_block(out, shard, block)]
        mirrors = []
        if mirror:  # (tokmix.sources imports pyarrow and fsspec: only when needed)
            from tokmix.sources import parse_mirrors

            mirrors = parse_mirrors(mirror)
        traced = trace_blocks(out, blocks, text, mirrors)
        if marked is not None:
            traced[0].token = marked
        warn_if_tokenizer_changed(out)
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    if as_json:
        print(json.dumps([b.to_json() for b in traced], indent=1))
        return
    if step is not None:  # the step as a whole first: a document spanning its blocks shows in each table below
        title = f"step {step:,}" + (f", rank {rank} of {world_size}" if world_size > 1 else "")
        console.print(render_summary(step_summary(traced), title, phase))
    for table in render_trace(traced):
        console.print(table)


@app.command()
def report(
    out: str = typer.Argument(..., help="output directory (or URL: s3://bucket/run, gs://...) of a finished run"),
    html: Path | None = typer.Option(None, "--html", "-o", help="where to write the report (default: OUT/report.html)"),
    scan: bool | None = typer.Option(None, "--scan/--no-scan",
                                     help="read the shards for document lengths and bytes per token "
                                          "(default: only when the intermediates are gone)"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Write a self-contained HTML report of a finished run (plots need matplotlib)."""
    from tokmix.report import write_report

    try:
        if html is None and is_url(out):
            raise TokmixError(f"{out}: a run on a store: name the report's local file with --html")
        path = write_report(out, html or Path(out) / "report.html", scan=scan)
        warn_if_tokenizer_changed(out)
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    console.print(f"report -> {path}")


cache_app = _App(cls=_Group, help="The token cache shared by runs (work units, streams' holdout documents, built "
                                  "benchmark sets): its size and entries, pruning, verifying.")
app.add_typer(cache_app, name="cache")
CACHE_OPTION = typer.Option(None, "--cache", help="the cache: a folder or URL (default: TOKMIX_CACHE, else "
                                                  "~/.cache/tokmix/units)")


def _the_cache(cache: str | None):
    from tokmix.cache import UnitCache, resolve

    root = resolve(cache)
    if root is None:
        raise TokmixError("the token cache is turned off (TOKMIX_CACHE=off): name one with --cache")
    return UnitCache(root)


@cache_app.callback(invoke_without_command=True)
def cache(
    ctx: typer.Context,
    cache: str | None = CACHE_OPTION,
    max_size: str | None = typer.Option(None, "--max-size", metavar="SIZE",
                                        help="evict least recently used entries down to SIZE (e.g. 20GiB)"),
    older_than: float | None = typer.Option(None, "--older-than", metavar="DAYS",
                                            help="remove entries not used for this many days"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", metavar="SHA256",
                                         help="remove the entries of the tokenizer whose sha256 starts with this"),
    debug: bool = typer.Option(False, "--debug"),
) -> None:
    """Show the token cache's size and entries by kind, tokenizer and source; prune it. Entries a running run
    holds are never removed."""
    if ctx.invoked_subcommand is not None:  # `tokmix cache --cache DIR verify`: the subcommand's cache is DIR
        pruning = [name for name, value in (("--max-size", max_size), ("--older-than", older_than),
                                            ("--tokenizer", tokenizer)) if value is not None]
        if pruning:
            _fail(TokmixError(f"{', '.join(pruning)}: prunes with `tokmix cache` alone, not with "
                              f"`{ctx.invoked_subcommand}`"), debug)
        ctx.obj = cache
        return
    from rich.table import Table

    from tokmix.cache import gib, summary

    try:
        unit_cache = _the_cache(cache)
        if max_size is not None or older_than is not None or tokenizer is not None:
            cap = parse_size(max_size, "--max-size") if max_size is not None else 1 << 62
            removed, freed = unit_cache.evict(cap, older_than=None if older_than is None else older_than * 86400,
                                              tokenizer=tokenizer)
            console.print(f"removed {removed:,} entries ({gib(freed)})")
        found = summary(list(unit_cache.entries()))
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    console.print(f"{unit_cache}: {gib(found['bytes'])} in {found['entries']:,} entries ({found['tokens']:,} tokens; "
                  f"{found['held']:,} held by runs)")
    for title, rows in (("kind", found["by_kind"]), ("tokenizer", found["by_tokenizer"]),
                        ("source", found["by_source"])):
        if not rows:
            continue
        table = Table(title=f"by {title}")
        table.add_column(title)
        table.add_column("entries", justify="right")
        table.add_column("size", justify="right")
        for name, (count, size) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:20]:
            table.add_row(name, f"{count:,}", gib(size))
        if len(rows) > 20:
            table.add_row(f"... {len(rows) - 20:,} more", "", "")
        console.print(table)


@cache_app.command("verify")
def cache_verify(ctx: typer.Context, cache: str | None = CACHE_OPTION,
                 debug: bool = typer.Option(False, "--debug")) -> None:
    """Check every entry of the token cache against its sha256; a damaged one is removed (exit 1)."""
    try:
        whole, problems = _the_cache(cache if cache is not None else ctx.obj).verify()
    except (TokmixError, OSError) as e:
        _fail(e, debug)
    for problem in problems:
        err.print(problem, highlight=False, soft_wrap=True)
    console.print(f"{whole:,} entries whole, {len(problems):,} damaged (removed)")
    if problems:
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    global _AS_COMMAND
    _AS_COMMAND = True
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
