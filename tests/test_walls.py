"""The walls between tokmix's modules (docs/architecture.md), read from the code's own imports: an AST scan of
every module (imports inside functions included) per wall, and fresh interpreters for what an import loads."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import tokmix

PACKAGE = Path(tokmix.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str) -> set[str]:
    """Every module `module` imports, at any depth of its code: `from a import b` counts as a and as a.b (b
    may be a module). tokmix imports absolutely (a relative import fails here, so none hides)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{module}: a relative import"
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return found


def tokmix_imports(module: str) -> set[str]:
    """The tokmix modules `module` imports (names imported from a module that are not modules themselves are
    dropped)."""
    return {name for name in imports_of(module) if name in MODULES and name != module}


def members(prefix: str) -> list[str]:
    return [m for m in MODULES if m == prefix or m.startswith(prefix + ".")]


# ---------------------------------------------------------------------------- what each foundation may import
# A foundation module imports only these tokmix modules: the format, the training side and reading sources
# stand on their own, so a training job or a Ray worker loads what it needs and nothing of the pipeline.
ONLY = {
    "tokmix.errors": set(),
    "tokmix.text": set(),
    "tokmix.ngrams": {"tokmix"},  # (from tokmix import _scan: its own compiled half, below)
    "tokmix.wire": set(),
    "tokmix.store": {"tokmix.errors", "tokmix.format.commit"},
    "tokmix.faults": set(),
    "tokmix.format": set(),
    "tokmix.format.records": set(),
    "tokmix.format.commit": {"tokmix.errors", "tokmix.faults"},
    "tokmix.shards": {"tokmix.errors", "tokmix.store", "tokmix.format.records", "tokmix.format.commit"},
    "tokmix.ownership": {"tokmix.shards", "tokmix.format.commit", "tokmix.unit_files"},
    "tokmix.unit_files": {"tokmix.shards", "tokmix.store", "tokmix.tokens"},
    "tokmix.tokens": {"tokmix.shards", "tokmix.store", "tokmix.format.records", "tokmix.format.commit"},
    "tokmix.provenance": {"tokmix.errors", "tokmix.shards", "tokmix.text", "tokmix.tokens", "tokmix.format.records"},
    "tokmix.interleave": {"tokmix.shards", "tokmix.tokens"},
    "tokmix.data": {"tokmix", "tokmix.errors", "tokmix.shards", "tokmix.tokens", "tokmix.provenance",
                    "tokmix.store", "tokmix.format.records"},
    "tokmix.recipe": {"tokmix.errors", "tokmix.shards"},
    "tokmix.cache": {"tokmix.errors", "tokmix.faults", "tokmix.shards", "tokmix.store", "tokmix.text",
                     "tokmix.unit_files"},
    "tokmix.backends": {"tokmix.errors", "tokmix.text", "tokmix.wire"},
    "tokmix.tokenizer": {"tokmix.backends", "tokmix.errors", "tokmix.recipe", "tokmix.shards", "tokmix.text",
                         "tokmix.tokens"},
    "tokmix.mirrors": {"tokmix.errors"},
    **{m: {"tokmix.errors", "tokmix.recipe", "tokmix.shards", "tokmix.text", "tokmix.mirrors", "tokmix.wire",
           *members("tokmix.sources")}
       for m in members("tokmix.sources")},
}
ONLY["tokmix.sources.parquet"] |= {"tokmix"}  # (from tokmix import _scan: its compiled reading pass, below)


def test_a_foundation_imports_only_what_it_may():
    assert {m: tokmix_imports(m) - ONLY[m] for m in ONLY if tokmix_imports(m) - ONLY[m]} == {}


# ---------------------------------------------------------------------------- what the stages may not import
STAGES = ("tokmix.stages.holdout", "tokmix.stages.streams", "tokmix.stages.assemble", "tokmix.stages.validate")
ABOVE_THE_STAGES = ("tokmix.pipeline", "tokmix.runner", "tokmix.cli", "tokmix.executors", "tokmix.progress",
                    "tokmix.summary", "tokmix.status", "tokmix.report", "tokmix.plan", "tokmix.inspect",
                    "tokmix.trace", "tokmix.manifest", "tokmix.demo", "tokmix.export", "tokmix.tokenizer")


def test_a_stage_imports_nothing_that_drives_or_shows_it():
    found = {m: tokmix_imports(m) & set(ABOVE_THE_STAGES) for m in members("tokmix.stages")}
    assert {m: names for m, names in found.items() if names} == {}


def test_stages_talk_through_their_outputs_not_each_others_code():
    """A stage reads what an earlier stage wrote (Layout's paths, records), never its functions; streams' repeat
    units (stages.passes) and the benchmark check (stages.decontam) are part of the streams stage."""
    found = {}
    for module in STAGES:
        others = {m for m in members("tokmix.stages") if m not in ("tokmix.stages", module)}
        # the repeat units and the benchmark check are part of the streams stage
        allowed = {"tokmix.stages.passes", "tokmix.stages.decontam"} if module == "tokmix.stages.streams" else set()
        found[module] = tokmix_imports(module) & others - allowed
    assert {m: names for m, names in found.items() if names} == {}


def test_the_supervisor_imports_none_of_the_pipeline():
    """The runner starts the stage process in a fresh interpreter: a change to the pipeline cannot break the
    lock, the recorded recipe or the restarts."""
    pipeline = {"tokmix.pipeline", "tokmix.tokenizer_stage", "tokmix.tokenizer", "tokmix.backends",
                *members("tokmix.stages"), *members("tokmix.sources")}
    assert tokmix_imports("tokmix.runner") & pipeline == set()


def closure(module: str) -> set[str]:
    """Every tokmix module `module` loads, through any chain of imports."""
    seen, todo = set(), [module]
    while todo:
        for name in tokmix_imports(todo.pop()) - seen:
            seen.add(name)
            todo.append(name)
    return seen


def test_the_stage_process_imports_nothing_of_its_supervisor():
    """The stage process (pipeline) and all it loads never import the supervisor (runner), nor the CLI above it:
    what both need (the options, the exit codes, the log line, the run's identity) lives below both."""
    assert closure("tokmix.pipeline") & {"tokmix.runner", "tokmix.cli"} == set()
    assert {m for m in MODULES if "tokmix.runner" in tokmix_imports(m)} <= {"tokmix.cli"}


# ---------------------------------------------------------------------------- index.json is read once
RECORDS = "tokmix.format.records"
INDEX_NAMES = {"index", "idx"}  # what a raw dict of index.json would be called


def raw_index_reads(module: str) -> list[str]:
    """`index[...]` and `index.get(...)` (of a name or attribute `index`): index.json read as a raw dict."""
    def is_index(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id in INDEX_NAMES) or \
            (isinstance(node, ast.Attribute) and node.attr in INDEX_NAMES)

    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Subscript) and is_index(node.value) and isinstance(node.ctx, ast.Load) or \
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and is_index(node.func.value):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_index_json_is_read_through_its_records_alone():
    """Every reader of index.json goes through tokmix.format.records (Index, ShardRecord, HoldoutEntry, ...): a
    key's default is in one place, and a new key is one field there."""
    found = {m: raw_index_reads(m) for m in MODULES if m != RECORDS}
    assert {m: reads for m, reads in found.items() if reads} == {}


# ---------------------------------------------------------------------------- storage is chosen in one place
STORE = "tokmix.store"


def storage_checks(module: str) -> list[str]:
    """`isinstance(..., ObjectPath)`: local or object store decided again, outside tokmix.store.storage()."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(MODULES[module].read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            and len(node.args) == 2 and "ObjectPath" in ast.unparse(node.args[1])]


def test_storage_is_chosen_in_the_store_module_alone():
    """Whether a path is local or on an object store is asked in tokmix.store (storage()); every other module
    writes, reads and commits through the storage it returns."""
    found = {m: storage_checks(m) for m in MODULES if m != STORE}
    assert {m: checks for m, checks in found.items() if checks} == {}


# ---------------------------------------------------------------------------- unit files have one owner
UNIT_FILES = "tokmix.unit_files"
# a unit file's kind ("tok"), its suffix ("000001.len", "*.src") or a glob into a units folder ("*/units/*.json")
UNIT_SPELLING = re.compile(r"(?:tok|len|src)|.*\.(?:tok|len|src)(?!\w).*|.*\bunits/\*.*", re.DOTALL)
WRITES = {"write_record", "write_bytes", "write_json", "write_tokens", "write_npy", "TokenFileWriter", "unlink",
          "rename", "replace"}


def unit_spellings(module: str) -> list[str]:
    """String literals (f-strings' pieces included, docstrings aside) that name a unit's files."""
    tree = ast.parse(MODULES[module].read_text())
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [f"line {node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and UNIT_SPELLING.fullmatch(node.value)]


def unit_writes(module: str) -> list[str]:
    """Writes and removals of a path built from a unit (`write_record(unit_file(...), ...)`,
    `(unit_dir / name).unlink()`): what only tokmix.unit_files may do."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        target = node.args[0] if isinstance(func, ast.Name) and node.args else \
            func.value if isinstance(func, ast.Attribute) else None
        if name in WRITES and target is not None and "unit" in ast.unparse(target).lower():
            found.append(f"line {node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_unit_files_are_named_in_one_module():
    """Only tokmix.unit_files spells a unit's files (NNNNNN.tok, .len, .src, .json): every other module asks it
    for their paths, so a new part of a unit is one edit there."""
    found = {m: unit_spellings(m) for m in MODULES if m != UNIT_FILES}
    assert {m: spelled for m, spelled in found.items() if spelled} == {}


def test_unit_files_are_written_and_removed_in_one_module():
    """Writing a unit's files, committing it (its record, last), and removing a damaged one happen in
    tokmix.unit_files (UnitFiles) alone."""
    found = {m: unit_writes(m) for m in MODULES if m != UNIT_FILES}
    assert {m: writes for m, writes in found.items() if writes} == {}


# a module's own compiled half (an extension module, no Python source): only these modules import it
COMPILED = {"tokmix.ngrams": "tokmix._scan", "tokmix.sources.parquet": "tokmix._scan"}


def test_no_module_imports_another_modules_private_names():
    private = {f"{module}: {name}" for module in MODULES for name in imports_of(module)
               if name.startswith("tokmix.") and name.rpartition(".")[2].startswith("_")
               and not name.rpartition(".")[2].startswith("__") and COMPILED.get(module) != name}
    assert private == set()


# ---------------------------------------------------------------------------- heavy libraries stay where they belong
ONLY_IN = {  # a library -> the modules that may import it
    "typer": {"tokmix.cli"},
    "rich": {"tokmix.cli", "tokmix.progress", "tokmix.summary", "tokmix.status", "tokmix.plan", "tokmix.inspect",
             "tokmix.trace"},
    "ray": {"tokmix.executors"},
    "pyarrow": {*members("tokmix.sources"), "tokmix.demo"},
}


def test_a_heavy_library_is_imported_only_where_it_is_used():
    found = {library: {m for m in MODULES if any(name.split(".")[0] == library for name in imports_of(m))}
             - ONLY_IN[library] for library in ONLY_IN}
    assert {library: modules for library, modules in found.items() if modules} == {}


# ---------------------------------------------------------------------------- what an import loads
def loaded_by(statement: str) -> set[str]:
    """Top-level names of the modules a fresh interpreter holds after `statement`."""
    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    return set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())


def test_the_training_side_loads_no_pipeline_library():
    assert {"pyarrow", "tokenizers", "rich", "typer", "ray"} & loaded_by("import tokmix.data") == set()


def test_importing_a_stage_loads_no_display():
    """A Ray worker imports the unit functions: the rich display and the CLI stay out of it."""
    assert {"rich", "typer"} & loaded_by("import tokmix.stages.streams, tokmix.stages.assemble") == set()


def test_a_commands_supervisor_and_status_start_without_the_array_libraries():
    """`tokmix run`'s own process (the supervisor, which starts the stage process) and `tokmix status` read
    records, never token arrays: numpy, pyarrow and the tokenizers stay out of them (numpy alone is ~0.2 CPU-s
    of every command's start)."""
    loaded = loaded_by("import tokmix.cli, tokmix.runner, tokmix.status")
    assert {"numpy", "pyarrow", "tokenizers", "fsspec"} & loaded == set()
