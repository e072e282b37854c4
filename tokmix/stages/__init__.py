"""The pipeline's stages, in order: holdout, streams, assemble, validate. Each takes a `Context` (what one
run knows: the recipe, the output layout, the split, the tokenizer) and is safe to run again after a kill."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokmix.progress import RunProgress
from tokmix.recipe import Recipe
from tokmix.shards import UNIT_BYTES, Layout
from tokmix.sources import Split


@dataclass
class Context:
    recipe: Recipe
    layout: Layout
    split: Split
    tokenizer_path: str
    backend: str
    dtype: np.dtype
    vocab_size: int
    workers: int
    mirrors: list[tuple[str, str]] = field(default_factory=list)
    executor: str = "local"
    log: Callable[[str], None] = print
    unit_bytes: int = UNIT_BYTES
    progress: RunProgress = field(default_factory=lambda: RunProgress(live=False))
    pool: Any = None  # the executor the stages share, started once per stage process (tokmix.executors)

    @property
    def threads_per_worker(self) -> int:
        """Backend threads each worker may use, so workers x threads matches the cores."""
        return max(1, (os.cpu_count() or 1) // self.workers)


def release_memory() -> None:
    """Hand freed heap back to the OS (glibc keeps it otherwise), so the memory guard sees what is in use."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
