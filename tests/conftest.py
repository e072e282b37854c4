"""Shared fixtures: one real finished run per session, which tests copy before changing anything, and one Ray
head, which every Ray test runs on. How pytest-xdist's workers share the tests out. And no silent gaps: under
CI=true a skipped test fails the run unless its reason is on the allow-list below."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A real run of the test corpus (decontamination on), finished and validated, its intermediates kept:
    root/out under a root that holds its corpus, split file, tokenizer and recipe. Read-only: copy it before
    changing anything."""
    import tokmix

    root = tmp_path_factory.mktemp("finished-run")
    recipe = make_inputs(root, doc_limit=400, rows_per_group=16, decontaminate=True)
    tokmix.run(tokmix.load_recipe(recipe), root / "out", workers=1, keep_streams=True)
    return root / "out"


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
# Measured under pytest -n 2 on 30c89e9 (CPU seconds of everything the module's tests started, a cpuacct cgroup
# per worker; wall of the module in its worker, at load 5-8): faults 78 CPU-s (174 s), store 57 (141),
# pretrained 46 (201), integrity 45 (112), ray + ray_cluster 55 (98; first: its head starts while the other
# worker works), trust 37 (94), pipeline 30 (92), decontam_cache 27 (76), untrusted_state 24 (104),
# user_errors 23 (56), backends 20 (55), leftovers 19 (62), huge_documents 15 (54), epochs 15 (37); every other
# module under 13 CPU-s and 53 s, so that the last ones handed out end within a few seconds of each other (the
# two workers ended 48 s apart when untrusted_state and pretrained, unlisted, came late in the order).
HEAVY_FIRST = ("test_ray", "test_faults", "test_store", "test_pretrained", "test_integrity", "test_trust",
               "test_pipeline", "test_decontam_cache", "test_untrusted_state", "test_user_errors", "test_backends",
               "test_leftovers", "test_huge_documents", "test_epochs", "test_decontam_reads",
               "test_tokenizer_edge_cases", "test_decontam_kill", "test_decontam_mixes")
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
