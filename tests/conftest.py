"""Shared fixtures: one real finished run per session (built once for both pytest-xdist workers), which tests copy
before changing anything, the demo corpus with its trained tokenizer (built once, copied per module), and one Ray
head, which every Ray test runs on. How pytest-xdist's workers share the tests out. And no silent gaps: under
CI=true a skipped test fails the run unless its reason is on the allow-list below."""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.corpus import make_inputs, plant_humaneval, with_schedule
from tests.ray_nodes import RUN, RayNode

# What CI may skip: only what its test command does not install or lay beside the clone. The default torch
# wheel is several GB, so torch (and megatron-core, which needs it) is not in the test extras; a bare clone has
# no reference script beside it (the golden conformance tests still run). Everything else a test needs (Ray
# included) is installed by the test command, and must run.
# The token cache is on by default in the user's cache folder: the suite never writes there. Its own tests
# (tests/test_cache.py, and the store and Ray tests that use one) name a cache of their own.
os.environ["TOKMIX_CACHE"] = "off"

ALLOWED_SKIPS = ("torch is not installed", "megatron-core is not installed",
                 "the reference script is not beside this clone")


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A read-only folder `build` fills once for the whole session: under pytest-xdist the first worker to ask
    builds it under a lock in the session's folder (the workers' basetemps' parent) and the other takes it as it
    is, instead of building the same again (the finished run: ~6.6 CPU-s). A build that failed or was cut short
    leaves no mark, so the next asker builds it again (and fails the same way)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    root, built = base / f"shared-{name}", base / f"shared-{name}.built"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            built.touch()
    return root


def _finished_run(root: Path) -> None:
    import tokmix

    recipe = make_inputs(root, doc_limit=400, rows_per_group=16, decontaminate=True)
    tokmix.run(tokmix.load_recipe(recipe), root / "out", workers=1, keep_streams=True)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A real run of the test corpus (decontamination on), finished and validated, its intermediates kept:
    root/out under a root that holds its corpus, split file, tokenizer and recipe. Read-only (both workers read
    it): copy it before changing anything."""
    return built_once(tmp_path_factory, "finished-run", _finished_run) / "out"


def _demo_inputs(root: Path) -> None:
    from tests.test_plan import train_demo_tokenizer
    from tokmix.demo import build_demo_corpus

    train_demo_tokenizer(build_demo_corpus(root / "corpus"), root / "tokenizer.json")


@pytest.fixture(scope="session")
def demo_inputs(tmp_path_factory) -> Path:
    """tokmix.demo's corpus (root/corpus, its recipe demo.toml) and a byte-level BPE trained beforehand on part of
    its train text (root/tokenizer.json, tests/test_plan.train_demo_tokenizer), built once (~3.8 CPU-s) for the
    modules that run the demo recipe. Read-only: demo_copy gives a module its own."""
    return built_once(tmp_path_factory, "demo-inputs", _demo_inputs)


def demo_copy(demo_inputs: Path, root: Path) -> tuple[Path, Path]:
    """A copy of demo_inputs in `root` (its recipe's paths are relative): (root/corpus/demo.toml, its tokenizer)."""
    shutil.copytree(demo_inputs, root, dirs_exist_ok=True)
    return root / "corpus" / "demo.toml", root / "tokenizer.json"


_ray_head: dict[str, object] = {}  # the running head: its RayNode and address


@pytest.fixture
def ray_head() -> str:
    """The address of a Ray head of 1 CPU, started once for the Ray tests (`ray start`, its own temp dir and
    process group; a start costs 10-25 s of the machine's two cores). Every Ray test runs on it by address, as a
    user's run on a cluster would; tests/test_ray_cluster.py adds a second node to it (1 CPU each, so a run of
    2 workers has a task on each). Tests that use it run in one pytest-xdist worker, one at a time (SAME_WORKER
    below): a second node added by one test must not take another test's tasks. Stopped as this process
    leaves the Ray tests' files (pytest_runtest_teardown below): its daemons cost CPU while idle."""
    pytest.importorskip("ray", reason="the Ray executor is an extra: pip install 'tokmix[ray]'")
    if not _ray_head:
        _ray_head["node"], _ray_head["address"] = RayNode.head(num_cpus=1)
    return _ray_head["address"]


def _stop_ray_head() -> None:
    if _ray_head:
        _ray_head.pop("node").stop()
        _ray_head.clear()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """The Ray head goes when the next test is in another unit of work than this one (see SAME_WORKER)."""
    if _ray_head and (nextitem is None or _unit(nextitem) != _unit(item)):
        _stop_ray_head()


def pytest_sessionfinish() -> None:
    _stop_ray_head()  # an interrupted session


# The Ray tests' schedule: a ramp and a long-context phase, (74 + 34) x 8 + 24 x 4 = 960 blocks with the margins
RAY_SCHEDULE = """
[[schedule]]
name = "main"
steps = 70
shares = { dclm = 0.45, edu = 0.35, code_py = 0.07, code_other = 0.13 }

[[schedule]]
name = "anneal"
steps = 30
ramp_steps = 10
shares = { dclm = 0.25, edu = 0.45, code_py = 0.1, code_other = 0.2 }

[[schedule]]
name = "long"
steps = 20
seq_len = 128
shares = { dclm = 0.3, edu = 0.4, code_py = 0.1, code_other = 0.2 }
"""


@pytest.fixture(scope="session")
def ray_corpus(tmp_path_factory) -> Path:
    """The Ray tests' inputs (a root with recipe.toml): every parquet row group of 16 documents a unit. The recipe
    is a schedule of three phases on the balanced interleave, the order that depends on the documents' lengths
    (the global order's bytes are the same on every executor too: test_pipeline runs it on threads and
    processes), so every Ray test checks that Ray writes a schedule's bytes as the local executor does. With
    [decontaminate] against HumanEval, three of its problems planted (one at a unit's start): every Ray run
    also drops them and records them as the local run does (test_ray.outputs holds contamination.json)."""
    root = tmp_path_factory.mktemp("ray-corpus")
    recipe = make_inputs(root, rows_per_group=16, decontaminate=True, steps=120, interleave='"balanced"')
    plant_humaneval(root, recipe, 16, {"edu": [2, 16], "code_py": [5]})  # and [decontaminate] with HumanEval
    with_schedule(recipe, RAY_SCHEDULE, recipe.name)
    return root


@pytest.fixture(scope="session")
def ray_cache(tmp_path_factory) -> Path:
    """A token cache (tokmix.cache) that ray_local_run fills and a Ray run reads from its workers."""
    return tmp_path_factory.mktemp("ray-cache")


@pytest.fixture(scope="session")
def ray_local_run(ray_corpus, ray_cache, tmp_path_factory) -> Path:
    """ray_corpus run with the local executor: the bytes every Ray run must write. It fills ray_cache."""
    import tokmix

    out = tmp_path_factory.mktemp("ray-local")
    tokmix.run(tokmix.load_recipe(ray_corpus / "recipe.toml"), out, executor="local", cache=str(ray_cache), **RUN)
    return out


# Under pytest-xdist (scripts/test.sh runs `-n 2`) each test module runs whole in one worker, so its module
# fixtures (real runs) are built once, and modules are handed out in collection order: the heaviest first, so
# that the short ones fill in at the end. Files listed in SAME_WORKER run in the worker of the file they map
# to: every Ray test runs where the Ray head is.
# Measured under pytest -n 2 on 448c645 (CPU seconds of everything the module's tests started, a cpuacct cgroup
# per worker; 890 CPU-s in all at load 4.6-10.5): tokenizer_edge_cases 87 (53 of them in the pytest worker: the
# oracles on runs of 20,000 characters and 20,000 short texts), faults 83, store 60, ray + ray_cluster 61 (first:
# its head starts while the other worker works), pretrained 50, integrity 47, trust 39, pipeline 29,
# decontam_cache 26, user_errors 25, untrusted_state 23, backends 22, decontam_kill 22, ngrams_native 21 (117 s
# of wall), decontam_reads 20, leftovers 18, decontam 18, epochs 17, decontam_build 17, conformance_wide 16;
# every other module under 13 CPU-s, so that the last ones handed out end within a few seconds of each other.
HEAVY_FIRST = ("test_ray", "test_tokenizer_edge_cases", "test_faults", "test_store", "test_pretrained",
               "test_integrity", "test_trust", "test_pipeline", "test_decontam_cache", "test_user_errors",
               "test_untrusted_state", "test_backends", "test_decontam_kill", "test_ngrams_native",
               "test_decontam_reads", "test_leftovers", "test_decontam", "test_epochs", "test_decontam_build",
               "test_conformance_wide", "test_cache", "test_huge_documents", "test_report", "test_decontam_mixes")
SAME_WORKER = {"tests/test_ray_cluster.py": "tests/test_ray.py"}


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _unit(item: pytest.Item) -> str:
    """The unit of work a test belongs to: its file, or the file SAME_WORKER puts it with."""
    return SAME_WORKER.get(_module(item), _module(item))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "ray_head" in getattr(item, "fixturenames", ()) and _unit(item) != "tests/test_ray.py":
            raise pytest.UsageError(f"{item.nodeid} uses the Ray head: list its file in tests/conftest.py's "
                                    "SAME_WORKER, so that it runs in the worker where the head is")

    def rank(item: pytest.Item) -> int:
        stem = Path(_unit(item)).stem
        return HEAVY_FIRST.index(stem) if stem in HEAVY_FIRST else len(HEAVY_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called only when it runs the tests
def pytest_xdist_make_scheduler(config, log):
    """Each module (SAME_WORKER's files joined) is one unit of work, handed out in collection order. Not xdist's
    `--dist loadgroup`: with pytest 9.2 its groups are silently ignored (pytest-xdist issue 1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return SAME_WORKER.get(module, module)

    config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems gave
    return ModuleScheduling(config, log)


def _skip_reason(report: pytest.TestReport) -> str:
    _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, str(report.longrepr))
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not any(allowed in reason for allowed in ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, and its reason is not on tests/conftest.py's ALLOWED_SKIPS: " \
                          f"{reason}"
