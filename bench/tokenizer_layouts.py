"""Backend throughput on tokenizers of every layout tokmix is asked to serve, each through bench/backends.py (every
backend, one thread and all cores, ids checked against HF):

    .venv/bin/python bench/tokenizer_layouts.py [--mb 5]

- gpt2: GPT-2's real ranks (tests/data/vocab) converted as `tiktoken = "gpt2.tiktoken"` is (50,257 ids);
- llama3: the same vocabulary behind Llama-3's pre-tokenizer (its regex split, then byte-level), BOS/EOS added;
- mistral-legacy / mistral-metaspace: Mistral 7B's real SentencePiece model in the two layouts HF's converters
  write (byte fallback; "▁" from a normalizer, or from a Metaspace pre-tokenizer that tokmix rewrites for fastokens).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_tokenizer_layouts import LLAMA3_PATTERN  # noqa: E402
from tests.vocab import gpt2_tiktoken, mistral_tokenizer_json  # noqa: E402
from tokmix.backends import read_tiktoken_file  # noqa: E402
from tokmix.recipe import recipe_from_dict  # noqa: E402
from tokmix.tokenizer import tokenizer_file  # noqa: E402

BASE = {"seed": 1, "layout": {"steps": 1, "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
        "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}


def tokenizers(folder: Path) -> dict[str, Path]:
    gpt2_tiktoken(folder)
    recipe = recipe_from_dict({**BASE, "tokenizer": {"tiktoken": "gpt2.tiktoken"}}, folder)
    gpt2 = Path(tokenizer_file(recipe, folder / "gpt2.tiktoken.json"))
    spec = json.loads(read_tiktoken_file(gpt2, "tokenizer_json"))  # the tokenizer.json view of the ranks
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    spec["added_tokens"] = [{"id": 50256 + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True}
                            for i, name in enumerate(["<|begin_of_text|>", "<|end_of_text|>"])]
    llama3 = folder / "llama3.json"
    llama3.write_text(json.dumps(spec, ensure_ascii=False))
    return {"gpt2": gpt2, "llama3": llama3,
            "mistral-legacy": mistral_tokenizer_json(folder / "mistral-legacy.json", metaspace=False),
            "mistral-metaspace": mistral_tokenizer_json(folder / "mistral-metaspace.json", metaspace=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=5.0, help="MB of text per cell (default 5)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokmix-bench-") as tmp:
        for name, path in tokenizers(Path(tmp)).items():
            print(f"\n== {name} ({path.name})", flush=True)
            subprocess.run([sys.executable, str(ROOT / "bench" / "backends.py"), "--tokenizer", str(path),
                            "--mb", str(args.mb)], check=True)


if __name__ == "__main__":
    main()
