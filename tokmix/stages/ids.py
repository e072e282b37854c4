"""Documents' own ids ([streams.X] id_field) beside a token file's provenance index: `train_000.ids` holds one
JSON value a line, line i the id of the i-th record of `train_000.docs` (a string or an integer, as the source
file has it; null for a document of a stream without an id_field). The 16-byte records stay as they are. The ids
are read back from the source files at the places the committed index records, once it is written: a parquet
file's id column alone, a JSONL file's lines up to the last one wanted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tokmix.format.records import IdsEntry, TokenFileEntry
from tokmix.provenance import Source, file_documents
from tokmix.shards import ids_name, write_bytes
from tokmix.sources import document_ids


def ids_of(root: Path, entry: TokenFileEntry, sources: list[Source], id_fields: dict[str, str],
           mirrors) -> list[str | int | None]:
    """The id of every document of the token file `entry` (an index.json shard or val entry), in its order."""
    records = file_documents(root, entry, sources).records
    values: list[str | int | None] = [None] * len(records)
    files: dict[tuple[str, str, str], list[np.ndarray]] = {}  # a file's documents, of every pass
    for s in np.unique(records["source"]).tolist():
        source = sources[s]
        if source.stream in id_fields:
            where = np.flatnonzero(records["source"] == s)
            files.setdefault((source.stream, source.kind, source.file), []).append(where)
    for (stream, kind, path), parts in files.items():
        at = np.concatenate(parts)
        places = records["place"][at].astype(np.int64)
        wanted = np.unique(places)
        found = document_ids(kind, path, id_fields[stream], stream, mirrors, wanted.tolist())
        for i, k in zip(at.tolist(), np.searchsorted(wanted, places).tolist()):
            values[i] = found[k]
    return values


def write_ids(root: Path, entry: TokenFileEntry, sources: list[Source], id_fields: dict[str, str],
              mirrors) -> TokenFileEntry:
    """Write the token file's ids beside it; the entry with them in its `provenance`."""
    values = ids_of(root, entry, sources, id_fields, mirrors)
    name = ids_name(entry.file)
    data = "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in values).encode("utf-8")
    ids = IdsEntry(file=name, documents=len(values), checksum=write_bytes(root / name, data))
    return entry.replace(provenance=entry.provenance.replace(ids=ids))
