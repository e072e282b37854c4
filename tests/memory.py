"""A process tree's memory as the memory guard sees it (tokmix.guards): the summed RSS of a process and all its
descendants, file-backed mapped pages included, as top shows it."""

from __future__ import annotations

import subprocess
import time

import psutil

SAMPLE_SECONDS = 0.02  # the memory guard's own poll is every 250 ms


def tree_peak(proc: subprocess.Popen) -> int:
    """The peak of `proc`'s tree, sampled every SAMPLE_SECONDS until it ends (a measurement, not a wait)."""
    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            break
        peak = max(peak, total)
        time.sleep(SAMPLE_SECONDS)
    return peak
