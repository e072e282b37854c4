"""Issue 30's benchmark: what a remix costs with the token cache (tokmix.cache, docs/cache.md).

    .venv/bin/python bench/cache.py bench [--backend hf] [--repeat 2] [--tokenizer T] [--corpus bench/work/corpus]
    .venv/bin/python bench/cache.py full  [--corpus bench/work/corpus] [--keep]

`bench`: the bench-scale corpus's recipe (bench/work/corpus/bench.toml), run cold with an empty cache (it fills
it); the remix (every share moved by 5-10 points) run with --no-cache (a cold run of the same recipe) and then
with the warm cache. Prints each run's wall time, the remix's as a share of the cold run of the same recipe, and
the tokens the remix tokenized against its goal: the sum of the streams' budget increases plus one unit per
stream. The outputs of the two remixes are compared byte for byte.

`full`: the full GPT-U-20M layout over bench/fullscale.py's corpus (built by it, hard links), default flags: the
recipe cold with an empty cache, then the remix with the warm one; seconds per stage of each (where the rest of
the remix's time goes: start-up, holdout, assemble, validate). Each run writes ~10 GiB: the outputs are removed
once measured, the cache (~6 GiB) at the end.

Everything goes to bench/work/cache/. The load average is printed before and after each run (a shared machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "cache"
# every share moved by 5 points, in the recipe's stream order: web, edu, code_py, code_other (the bench corpus's
# train files hold ~1.45 times each stream's budget: code_py's 7% cannot grow by 5 points, code_other's 13% can)
MOVES = (-0.05, 0.05, -0.05, 0.05)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def remix(recipe: Path, out: Path) -> Path:
    """The recipe with every stream's share moved by MOVES (still summing to 1)."""
    text = recipe.read_text()
    names = re.findall(r"^\[streams\.(\w+)\]", text, flags=re.M)
    for name, move in zip(names, MOVES, strict=True):
        pattern = rf"(\[streams\.{name}\][^\[]*?share = )([0-9.]+)"
        share = round(float(re.search(pattern, text, flags=re.S).group(2)) + move, 4)
        text = re.sub(pattern, lambda m, v=share: f"{m.group(1)}{v}", text, count=1, flags=re.S)
    out.write_text(text)
    return out


def tokmix(recipe: Path, out: Path, cache: Path | None, *flags: str) -> dict:
    """One `tokmix run` (default flags but `flags`); its wall time, stage seconds and index."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "TOKMIX_CACHE": str(cache) if cache else "off"}
    before = load()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tokmix.cli", "run", str(recipe), "--out", str(out), *flags],
                          capture_output=True, text=True, env=env, cwd=recipe.parent)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"tokmix failed:\n{proc.stderr[-3000:]}")
    index = json.loads((out / "index.json").read_text())
    timings = json.loads((out / "tokmix-state" / "timings.json").read_text())
    timings["setup"] = round(wall - sum(v for k, v in timings.items() if k != "tokenizer"), 3)
    print(f"  {out.name}: {wall:,.1f} s ({', '.join(f'{k} {v:,.1f}' for k, v in timings.items())}); "
          f"load {before} -> {load()}", flush=True)
    return {"wall": wall, "timings": timings, "index": index, "log": proc.stdout}


def digest(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted([*out.glob("*.bin"),
                                                                                  *out.glob("*.docs")])}


def tokenized(remixed: dict, cold: dict) -> tuple[int, int]:
    """(tokens of the units the remix used that it tokenized itself, the streams' budget growth)."""
    streams, before = remixed["index"]["mix"]["streams"], cold["index"]["mix"]["streams"]
    grown = sum(max(0, s["budget"] - before[n]["budget"]) for n, s in streams.items())
    return remixed["index"]["cache"]["tokens_tokenized"], grown


def held_out(took: dict) -> str:
    """What the holdouts' reads took from the cache (index.json's cache.holdouts)."""
    held = took.get("holdouts", {})
    return (f"holdouts: {held.get('tokens_from_cache', 0):,} tokens from the cache, "
            f"{held.get('tokens_tokenized', 0):,} encoded")


def corpus_view(corpus: Path) -> Path:
    """WORK/corpus: links to the bench corpus's files and folders, where this benchmark writes its recipes (the
    corpus is shared and read-only; its recipe's paths are relative to the recipe)."""
    view = WORK / "corpus"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    for entry in corpus.resolve().iterdir():
        (view / entry.name).symlink_to(entry)
    (view / "bench.toml").unlink()
    shutil.copy(corpus / "bench.toml", view / "bench.toml")
    return view


def use_tokenizer(recipe: Path) -> Path:
    """The recipe with WORK/tokenizer.json as its tokenizer, in place of [tokenizer.train]."""
    text = re.sub(r"\[tokenizer\.train\]\n(\w+ = .*\n)*", f'[tokenizer]\npath = "{WORK / "tokenizer.json"}"\n',
                  recipe.read_text())
    recipe.write_text(text)
    return recipe


def bench(args) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    view = corpus_view(Path(args.corpus))
    recipe = view / "bench.toml"
    cache = WORK / "bench-cache"
    shutil.rmtree(cache, ignore_errors=True)
    flags = ("--tokenizer-backend", args.backend) if args.backend else ()
    print(f"bench-scale corpus, backend {args.backend or 'auto'}, cache {cache}")
    if args.tokenizer:  # a tokenizer trained before (bench/fullscale.py's): the cold run does not train one
        shutil.copy(args.tokenizer, WORK / "tokenizer.json")
        use_tokenizer(recipe)
    cold = tokmix(recipe, WORK / "cold", cache, *flags, "--keep-streams")
    biggest = max(json.loads(p.read_text())["tokens"] for p in (WORK / "cold").glob("streams/*/units/*.json"))
    # the remix uses the tokenizer the cold run used (training on other shares would learn another one)
    if not args.tokenizer:
        shutil.copy(WORK / "cold" / "tokenizer.json", WORK / "tokenizer.json")
    mixed = use_tokenizer(remix(recipe, view / "bench-remix.toml"))  # beside it: its paths are relative
    after_cold = WORK / "bench-cache-after-cold"  # each warm remix starts from the cache the cold run left
    shutil.rmtree(after_cold, ignore_errors=True)
    shutil.copytree(cache, after_cold, copy_function=os.link)
    for round_no in range(args.repeat):  # the pair's order alternates: a load that drifts favours neither
        runs = {}
        for kind in (("nocache", "warm") if round_no % 2 == 0 else ("warm", "nocache")):
            if kind == "warm":
                shutil.rmtree(cache, ignore_errors=True)
                shutil.copytree(after_cold, cache, copy_function=os.link)
            runs[kind] = tokmix(mixed, WORK / f"remix-{kind}", cache if kind == "warm" else None, *flags)
        fresh, warm = runs["nocache"], runs["warm"]
        same = digest(WORK / "remix-warm") == digest(WORK / "remix-nocache")
        done, grown = tokenized(warm, cold)
        took = warm["index"]["cache"]
        print(f"round {round_no + 1}: remix: {took['units_from_cache']:,} of {took['units']:,} units "
              f"({took['tokens_from_cache']:,} tokens) from the cache; tokenized {done:,} tokens, goal <= "
              f"{grown:,} (budget growth) + {len(MOVES)} x {biggest:,} (a unit a stream) = "
              f"{grown + len(MOVES) * biggest:,}; {held_out(took)}")
        print(f"round {round_no + 1}: remix wall {warm['wall']:,.1f} s = {warm['wall'] / fresh['wall']:.0%} of the "
              f"same recipe's cold run ({fresh['wall']:,.1f} s); streams stage {warm['timings']['streams']:,.2f} s "
              f"against {fresh['timings']['streams']:,.2f} s; byte-identical to --no-cache: {same}", flush=True)
    for name in ("cold", "remix-nocache", "remix-warm", "corpus"):
        shutil.rmtree(WORK / name, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(after_cold, ignore_errors=True)


def full(args) -> None:
    sys.path.insert(0, str(HERE))
    import fullscale

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    corpus = Path(args.corpus).resolve()
    fullscale.cr.WORK = fullscale.WORK
    recipe_numbers = tomllib.loads(fullscale.RECIPE.read_text())
    split = fullscale.build_corpus(corpus, recipe_numbers)
    base_streams = {n: (s["domain"], s["share"], str(corpus / fullscale.FOLDER[n]))
                    for n, s in recipe_numbers["streams"].items()}
    fullscale.cr.tokenizer_once(fullscale.cr.Setup(recipe_numbers["seed"], recipe_numbers["layout"],
                                                   recipe_numbers["holdout"], base_streams,
                                                   fullscale._base_split(corpus, split)), 40.0)
    recipe = fullscale.write_recipe(recipe_numbers)
    mixed = remix(recipe, recipe.with_name("recipe-remix.toml"))
    cache = WORK / "full-cache"
    shutil.rmtree(cache, ignore_errors=True)
    print(f"full GPT-U-20M layout, default flags, cache {cache}")
    cold = tokmix(recipe, WORK / "full-cold", cache)
    shutil.rmtree(WORK / "full-cold", ignore_errors=True)
    warm = tokmix(mixed, WORK / "full-remix", cache, *(("--keep-streams",) if args.keep else ()))
    if not args.keep:
        shutil.rmtree(WORK / "full-remix", ignore_errors=True)
    took = warm["index"]["cache"]
    done, grown = tokenized(warm, cold)
    print(f"remix: {took['units_from_cache']:,} of {took['units']:,} units ({took['tokens_from_cache']:,} tokens) "
          f"from the cache; tokenized {done:,} tokens (budget growth {grown:,}); {held_out(took)}")
    print(f"remix wall {warm['wall']:,.1f} s = {warm['wall'] / cold['wall']:.0%} of the cold run's "
          f"({cold['wall']:,.1f} s)")
    for stage in ("setup", "tokenizer", "holdout", "streams", "assemble", "validate"):
        was, now = cold["timings"].get(stage, 0), warm["timings"].get(stage, 0)
        print(f"  {stage:<10} cold {was:8.1f} s   remix {now:8.1f} s")
    shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scale", choices=("bench", "full"))
    parser.add_argument("--corpus", default=str(HERE / "work" / "corpus"))
    parser.add_argument("--backend", default=None, help="bench: --tokenizer-backend of every run (e.g. hf)")
    parser.add_argument("--repeat", type=int, default=1, help="bench: rounds of the remix pair (--no-cache, warm)")
    parser.add_argument("--keep", action="store_true", help="full: keep the remix's output and units "
                                                            f"({WORK / 'full-remix'}: bench/assemble.py's input)")
    parser.add_argument("--tokenizer", default=None, help="bench: a tokenizer.json for every run (default: the cold "
                                                          "run trains the recipe's)")
    args = parser.parse_args()
    bench(args) if args.scale == "bench" else full(args)


if __name__ == "__main__":
    main()
