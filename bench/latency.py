"""Latencies the tests used to assert with a clock (a shared CI machine makes such asserts flaky): HF encoding the
adversarial texts choose_backend checks a fast backend against (was `< 1.0 s`), and `tokmix plan` on the full
demo corpus (was `< 10 s`). Each is measured --repeat times; the best and the median are printed.

    .venv/bin/python bench/latency.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from tokmix.backends import ADVERSARIAL_TEXTS
from tokmix.demo import build_demo_corpus
from tokmix.plan import make_plan
from tokmix.recipe import load_recipe
from tokmix.text import clean_surrogates
from tokmix.tokenizer import train_tokenizer


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    repeat = parser.parse_args().repeat
    with tempfile.TemporaryDirectory(prefix="tokmix-latency-") as tmp:
        recipe = build_demo_corpus(Path(tmp) / "corpus")
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        docs = [p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:200]]
        train_tokenizer(iter(docs), 2000, 1, Path(tmp) / "tokenizer.json")
        tokenizer = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
        texts = [clean_surrogates(t) for t in ADVERSARIAL_TEXTS]
        rows = {
            "HF encode of the adversarial texts": timed(lambda: tokenizer.encode_batch(texts), repeat),
            "tokmix plan, demo corpus (scale 1)": timed(lambda: make_plan(load_recipe(recipe),
                                                                          out=Path(tmp) / "out"), repeat),
        }
    for name, seconds in rows.items():
        print(f"{name:38s} best {min(seconds):6.3f} s  median {statistics.median(seconds):6.3f} s  ({repeat} runs)")


if __name__ == "__main__":
    main()
