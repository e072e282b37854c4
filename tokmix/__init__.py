"""tokmix: turn raw text and code into token shards at exact mixture shares, with holdouts that never leak
into training, reproducible to the byte and resumable after any crash.

    import tokmix
    recipe = tokmix.load_recipe("recipes/demo.toml")
    index = tokmix.run(recipe, out="out", workers=2)

The pipeline is imported on first use, so `import tokmix.data` in a training job pulls in numpy alone.
"""

from tokmix.errors import TokmixError

__all__ = ["Recipe", "RunOptions", "TokmixError", "load_recipe", "run"]
__version__ = "0.1.0"

_LAZY = {"Recipe": "tokmix.recipe", "load_recipe": "tokmix.recipe", "RunOptions": "tokmix.process",
         "run": "tokmix.runner"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tokmix' has no attribute {name!r}")
