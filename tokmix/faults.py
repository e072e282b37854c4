"""Fault injection for the crash-safety tests: named points inside every stage where a run can be made to
kill itself. `TOKMIX_FAULT=assemble:after-rename:3` SIGKILLs the whole process group (supervisor, stage
process and workers) the 3rd time a process passes that point; `...:3:restart` instead exits the stage
process with the restart code, as the memory guard does, and `...:3:pause` writes "paused" to the FIFO
named by TOKMIX_PAUSE_FIFO and waits for a signal. Several specs may be given, comma-separated.
Without the variable a fault point costs one dictionary lookup."""

from __future__ import annotations

import os
import signal
import sys

RESTART_EXIT_CODE = 75

POINTS = (
    "tokenizer:after-train",
    "holdout:after-write",  # val_<domain>.bin renamed, index.json not yet updated
    "holdout:after-index",
    "streams:unit-mid-write",  # half of a batch of a unit's tokens written (tokmix.shards.TokenFileWriter)
    "streams:unit-before-rename",  # a unit's tokens written under the temporary name
    "streams:unit-before-record",  # tokens and lengths committed, the unit's record not yet
    "streams:after-unit",  # the coordinator got a committed unit
    "streams:before-meta",
    "streams:after-meta",
    "assemble:mid-write",  # half of a gathered part of a shard written
    "assemble:before-rename",  # a shard fully written under its temporary name
    "assemble:after-rename",  # the shard visible, its record not yet written
    "assemble:after-record",
    "assemble:before-index",
    "validate:before",
    "cleanup:before",  # validated, intermediates not yet removed
    "runner:before-restart",  # the supervisor between a stage process's restart exit and the next start
    "publish:before-move",  # an object uploaded under its temporary name, not yet moved to its final one
    "write:middle",  # half of a file's bytes written (tokmix.shards.write_bytes: every file but token files)
)

_counts: dict[str, int] = {}


def exit_for_restart() -> None:
    """End this stage process at once for the supervisor to start a fresh one: workers first, so that none
    is left holding the output pipes or memory."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        child.kill()
    sys.stdout.flush()
    os._exit(RESTART_EXIT_CODE)


def _specs() -> list[tuple[str, int, str]]:
    specs = []
    for spec in filter(None, os.environ.get("TOKMIX_FAULT", "").split(",")):
        stage, point, *rest = spec.split(":")
        hit = int(rest[0]) if rest else 1
        action = rest[1] if len(rest) > 1 else "kill"
        specs.append((f"{stage}:{point}", hit, action))
    return specs


def fault_point(name: str) -> None:
    """Kill or restart here if TOKMIX_FAULT asks for this point."""
    if "TOKMIX_FAULT" not in os.environ:
        return
    _counts[name] = _counts.get(name, 0) + 1
    for point, hit, action in _specs():
        if point == name and _counts[name] == hit:
            sys.stdout.flush()
            if action == "restart":
                exit_for_restart()
            if action == "pause":  # tell the test through its FIFO, then wait for its signal
                with open(os.environ["TOKMIX_PAUSE_FIFO"], "w") as f:
                    f.write("paused")
                while True:
                    signal.pause()
            os.killpg(os.getpgid(0), signal.SIGKILL)
