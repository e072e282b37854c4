"""Source files: where they are (files), the holdout/train split (split), work units and the documents read
out of them (units), one module per format (parquet, jsonl, text), and what the formats share (pieces).
The names below are what the stages, plan and tests use."""

import os

os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # glibc gives arrow buffers back; jemalloc hoards

from tokmix.mirrors import parse_mirrors, remap  # noqa: E402
from tokmix.sources.files import expand, file_size, open_file  # noqa: E402
from tokmix.sources.parquet import HEAVY_ROW_GROUP_BYTES  # noqa: E402
from tokmix.sources.pieces import HugeText, Piece, Places, SourceError  # noqa: E402
from tokmix.sources.split import Split, create_split, load_or_create_split, stream_files  # noqa: E402
from tokmix.sources.units import (  # noqa: E402
    Unit,
    batches,
    document_ids,
    file_kind,
    iter_file_texts,
    plan_units,
    read_texts,
    text_hashes,
    text_keys,
)

__all__ = [
    "HEAVY_ROW_GROUP_BYTES", "HugeText", "Piece", "Places", "SourceError", "Split", "Unit", "batches", "create_split",
    "document_ids",
    "expand", "file_kind", "file_size", "iter_file_texts", "load_or_create_split", "open_file", "parse_mirrors",
    "plan_units", "read_texts", "remap", "stream_files", "text_hashes", "text_keys",
]
