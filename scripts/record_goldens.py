"""Record tests/golden/reference/ from a real run of the reference script on the golden inputs: the sha256 of
every file it writes (JSON files without their speeds and seconds) and its index.json. Run it after changing
the golden inputs; tests/test_conformance.py then checks tokmix against them anywhere, and the reference
against them wherever the reference script is present.

    python scripts/record_goldens.py        # needs shared/reference/prepare_tokens.py beside the repository
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reference import GOLDEN, REFERENCE, digests, run_reference, stable_json  # noqa: E402
from tokmix.recipe import load_recipe  # noqa: E402


def main() -> None:
    if REFERENCE is None:
        sys.exit("record_goldens: the reference script is not beside the repository (shared/reference/"
                 "prepare_tokens.py) and TOKMIX_REFERENCE is not set")
    with tempfile.TemporaryDirectory(prefix="tokmix-goldens-") as tmp:
        root = Path(tmp)
        shutil.copytree(GOLDEN, root, dirs_exist_ok=True, ignore=shutil.ignore_patterns("reference"))
        out = run_reference(root, load_recipe(root / "recipe.toml"))
        target = GOLDEN / "reference"
        target.mkdir(exist_ok=True)
        index = stable_json(json.loads((out / "index.json").read_text()))
        (target / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        recorded = digests(out)
        (target / "sha256.json").write_text(json.dumps(recorded, indent=2) + "\n")
    print(f"recorded {len(recorded)} digests from {REFERENCE} into {target}")


if __name__ == "__main__":
    main()
