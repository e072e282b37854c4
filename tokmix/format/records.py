"""The records tokmix writes as JSON, typed: index.json (`Index`) and what it holds (shards, holdouts, the mix,
the totals, the provenance), a work unit's record and a stream's record. Each record is read once here
(`from_json`: the defaults of an absent key in one place) and written once (`to_json`: the keys in the order
tokmix writes them, an absent key left absent, a key this tokmix does not know kept). Adding a key to
index.json is one field here and its line in docs/format.md."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

# index.json's format: 1 is the first that records it; an index.json without one (0) is the same format, as
# every tokmix before it wrote
FORMAT_VERSION = 1
EOT_ID = 0


def _many(record: type, container: type) -> dict[str, Any]:
    """A field holding records of `record`: a list of them, or a dict of them by name."""
    return {"record": record, "container": container}


def _one(record: type) -> dict[str, Any]:
    return {"record": record, "container": None}


@dataclass(frozen=True)
class Record:
    """A JSON object as a frozen dataclass: its fields in the order written. A field is None when its key is
    absent, unless `DEFAULTS` names what an absent key means; `extra` keeps the keys this tokmix does not know,
    and `absent` which keys were absent, so that a record read and written again is the same JSON."""

    DEFAULTS: ClassVar[dict[str, Any]] = {}
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)
    absent: frozenset[str] = field(default=frozenset(), repr=False, compare=False, kw_only=True)

    @classmethod
    def keys(cls) -> list[dataclasses.Field]:
        return [f for f in dataclasses.fields(cls) if f.name not in ("extra", "absent")]

    @classmethod
    def from_json(cls, obj: dict[str, Any]):
        values, absent = {}, set()
        for f in cls.keys():
            key = _key(f)
            if key not in obj:
                absent.add(f.name)
                if f.name in cls.DEFAULTS:
                    values[f.name] = cls.DEFAULTS[f.name]
                continue
            value, kind = obj[key], f.metadata.get("record")
            if kind is not None and value is not None:
                container = f.metadata["container"]
                if container is list:
                    value = [kind.from_json(v) for v in value]
                elif container is dict:
                    value = {k: kind.from_json(v) for k, v in value.items()}
                else:
                    value = kind.from_json(value)
            values[f.name] = value
        names = {_key(f) for f in cls.keys()}
        return cls(**values, extra={k: v for k, v in obj.items() if k not in names}, absent=frozenset(absent))

    def to_json(self) -> dict[str, Any]:
        """The record's JSON: a field absent when read stays absent, a None is written only where it means
        something (`null` fields)."""
        out = {}
        for f in self.keys():
            value = getattr(self, f.name)
            if f.name in self.absent or (value is None and not f.metadata.get("null")):
                continue
            if f.metadata.get("record") is not None and value is not None:
                container = f.metadata["container"]
                if container is list:
                    value = [v.to_json() for v in value]
                elif container is dict:
                    value = {k: v.to_json() for k, v in value.items()}
                else:
                    value = value.to_json()
            out[_key(f)] = value
        return {**out, **self.extra}

    def has(self, name: str) -> bool:
        """Whether the JSON held the key of field `name` (a default stands in for an absent one)."""
        return name not in self.absent

    def replace(self, **changes):
        """This record with some fields set (a key set is no longer absent)."""
        return dataclasses.replace(self, absent=self.absent - set(changes), **changes)


def _key(f: dataclasses.Field) -> str:
    """A field's key in the JSON: its name, unless the name is Python's (`pass`)."""
    return f.metadata.get("key", f.name)


NULL = {"null": True}  # a field whose None is written (an unlimited unit's `limit`)


# ---------------------------------------------------------------------------- what index.json holds
@dataclass(frozen=True)
class IdsEntry(Record):
    """The documents' own ids (.ids, with a stream's id_field) beside a token file's provenance index."""

    file: str = ""
    documents: int = 0
    checksum: str = ""


@dataclass(frozen=True)
class DocsEntry(Record):
    """The provenance index (.docs) of one token file, as its shard or holdout entry records it."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"skip": 0}
    file: str = ""
    documents: int = 0
    skip: int = 0
    checksum: str | None = None  # None: recorded by a tokmix before it was
    sources: list | None = None  # a holdout's own table of sources (a train shard's is the run's)
    ids: IdsEntry | None = field(default=None, metadata=_one(IdsEntry))  # without an id_field: absent


@dataclass(frozen=True)
class ShardRecord(Record):
    """One train shard: its file, size, the tokens each stream put in it, its sha256 and its provenance index."""

    file: str = ""
    tokens: int = 0
    blocks: int = 0
    tokens_by_stream: dict[str, int] = field(default_factory=dict)
    checksum: str | None = None
    provenance: DocsEntry | None = field(default=None, metadata=_one(DocsEntry))
    phase: str | None = None  # with a schedule: the phase the shard's blocks are of, and its seq_len
    seq_len: int | None = None


@dataclass(frozen=True)
class HoldoutEntry(Record):
    """One domain's holdout (val file): its tokens, scored targets, documents, bytes and the evaluation
    windows, the source files it was read from, its sha256 and its provenance index."""

    file: str = ""
    tokens: int = 0
    targets: int = 0
    docs: int = 0
    bytes: int = 0
    eval_windows: int | None = None
    eval_targets: int | None = None
    eval_bytes: int | None = None
    tokens_by_stream: dict[str, int] = field(default_factory=dict)
    source_files: list[str] = field(default_factory=list)
    checksum: str | None = None
    provenance: DocsEntry | None = field(default=None, metadata=_one(DocsEntry))


@dataclass(frozen=True)
class StreamSummary(Record):
    """A finished stream as index.json's `mix.streams` records it: its record less its units."""

    name: str = ""
    tokens: int = 0
    docs: int = 0
    budget: int = 0
    seconds_last_run: float = 0.0
    tok_s_end_to_end: int = 0
    tok_s_tokenizer_capacity: int = 0
    num_proc: int = 0
    backend: str = ""
    dropped_holdout_duplicates: int = 0
    passes: int = 1
    pass_tokens: int | None = None  # only with more than one pass
    pass_docs: int | None = None
    # with [decontaminate]: documents and tokens the benchmarks took, per benchmark (docs/format.md)
    benchmark_contamination: dict[str, Any] | None = None


@dataclass(frozen=True)
class Mix(Record):
    """index.json's `mix`: what was asked of each stream and what each stream gave."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"interleave": "global"}
    method: str = ""
    target_share_by_stream: dict[str, float] = field(default_factory=dict)
    domain_by_stream: dict[str, str] = field(default_factory=dict)
    streams: dict[str, StreamSummary] = field(default_factory=dict, metadata=_many(StreamSummary, dict))
    documents_used: dict[str, int] | None = None
    passes_by_stream: dict[str, float] | None = None
    interleave: str = "global"
    balance: dict[str, Any] | None = None  # a balanced interleave's bound and each stream's worst deviations


@dataclass(frozen=True)
class Total(Record):
    """index.json's `total`: the tokens of the train shards, by stream and domain, and their shares."""

    tokens: int = 0
    tokens_by_stream: dict[str, int] = field(default_factory=dict)
    tokens_by_domain: dict[str, int] = field(default_factory=dict)
    share_by_stream: dict[str, float] = field(default_factory=dict)
    share_by_domain: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Provenance(Record):
    """index.json's `provenance`: the layout of a .docs record, the train shards' table of sources and the
    text field each stream's documents were read from."""

    record: list | None = None
    sources: list = field(default_factory=list)
    text_fields: dict[str, str] = field(default_factory=dict)
    id_fields: dict[str, str] | None = None  # the streams whose documents' ids are kept, and each one's field


def _span() -> list[int]:
    return [0, 0]


@dataclass(frozen=True)
class PhaseEntry(Record):
    """One phase of a schedule, as index.json's `phases` records it: its steps, blocks, tokens and shards (each a
    range [first, end)), its layout, the shares it asks for, and every stream's target and realized tokens."""

    name: str = ""
    steps: list[int] = field(default_factory=_span)
    margin_steps: int = 0
    ramp_steps: int = 0
    seq_len: int = 0
    seqs_per_step: int = 0
    blocks: list[int] = field(default_factory=_span)
    tokens: list[int] = field(default_factory=_span)
    shards: list[int] = field(default_factory=_span)
    requested_share_by_stream: dict[str, float] = field(default_factory=dict)
    target_tokens_by_stream: dict[str, float] = field(default_factory=dict)
    tokens_by_stream: dict[str, int] = field(default_factory=dict)
    share_by_stream: dict[str, float] = field(default_factory=dict)

    @property
    def step_count(self) -> int:
        return self.steps[1] - self.steps[0]

    @property
    def block_count(self) -> int:
        return self.blocks[1] - self.blocks[0]


@dataclass(frozen=True)
class Index(Record):
    """index.json: what a training loop and an evaluator read (docs/format.md documents every key). The index
    the holdout stage keeps while a run is being built holds `val` alone: every other field is then None."""

    DEFAULTS: ClassVar[dict[str, Any]] = {"format_version": 0, "dtype": "uint16", "eot_id": EOT_ID,
                                          "margin_steps": 0, "shards": [], "val": {}}
    format_version: int = FORMAT_VERSION
    tokenizer: str | None = None
    tokenizer_sha256: str | None = None
    # whose ids these are (the format's own library), its version, and the digest of its ids on tokmix's check
    # texts (what validate encodes again under other versions); the backend's library is under throughput
    tokenizer_oracle: str | None = None
    tokenizer_libraries: dict[str, str] | None = None
    # a run resumed under other versions of the oracle's library (its ids re-checked identical then): those versions;
    # tokenizer_libraries stays the versions the run started under. Absent for a run that never changed them
    tokenizer_libraries_resumed: dict[str, str] | None = None
    tokenizer_ids_sha256: str | None = None
    tokmix_version: str | None = None
    vocab_size: int | None = None
    # ids below vocab_size that are no token, as [first, end) ranges (tiktoken's gaps before its special tokens:
    # cl100k's [[100256, 100257], [100261, 100276]]); absent when every id is one: validate refuses a shard's
    no_token_ids: list[list[int]] | None = None
    dtype: str = "uint16"
    seq_len: int | None = None
    block: int | None = None
    stride: int | None = None
    eot_id: int = EOT_ID
    delimiters: dict[str, list[int]] | None = None
    delimiter_tokens: dict[str, list[str]] | None = None
    seed: int | None = None
    recipe_fingerprint: str | None = None
    mix: Mix | None = field(default=None, metadata=_one(Mix))
    blocks: int | None = None
    train_steps: int | None = None
    seqs_per_step: int | None = None
    margin_steps: int = 0
    shards: list[ShardRecord] = field(default_factory=list, metadata=_many(ShardRecord, list))
    phases: list[PhaseEntry] | None = field(default=None, metadata=_many(PhaseEntry, list))  # with a schedule
    total: Total | None = field(default=None, metadata=_one(Total))
    decontamination: dict[str, Any] | None = None
    throughput: dict[str, Any] | None = None
    val: dict[str, HoldoutEntry] = field(default_factory=dict, metadata=_many(HoldoutEntry, dict))
    cache: dict[str, Any] | None = None  # what the streams took from the token cache (docs/cache.md)
    provenance: Provenance | None = field(default=None, metadata=_one(Provenance))
    # with [decontaminate]: the benchmarks, what they took per stream, and contamination.json (docs/format.md)
    benchmark_decontamination: dict[str, Any] | None = None
    # where the run keeps the shards' sha256 derived from the units and the seed (tokmix-state/expected.json): a
    # run that names it and lost it fails validation; None: a run of a tokmix before it was kept
    derived_digests: str | None = None

    @property
    def stream_names(self) -> list[str]:
        """The run's streams, in the recipe's order."""
        return list(self.mix.streams) if self.mix is not None else []

    @property
    def finished(self) -> bool:
        """Whether the index is a finished run's (not the holdout stage's, which holds the holdouts alone)."""
        return bool(self.shards)


# ---------------------------------------------------------------------------- the intermediates' records
@dataclass(frozen=True)
class UnitRecord(Record):
    """A committed work unit's record (NNNNNN.json, sealed), written after its token, length and place files:
    what it was cut from, what it holds and each file's sha256. A repeat unit (pass 2 on) is a copy of pass 1's
    unit `source_unit` and reads no source."""

    index: int = 0
    name: str = ""
    pass_no: int | None = field(default=None, metadata={"key": "pass"})
    source_unit: int | None = None
    pieces: list | None = None
    tokens: int = 0
    docs: int = 0
    chars: int = 0
    size: int = 0
    file_bytes: int | None = None
    limit: int | None = field(default=None, metadata=NULL)
    dropped_at: list[int] = field(default_factory=list)
    encode_seconds: float = 0.0
    tok_sha256: str | None = None
    len_sha256: str | None = None
    src_sha256: str | None = None
    lines: list[int] | None = None
    # with [decontaminate]: [kept documents before it, piece, place, tokens, items...] per contaminated document
    contaminated: list[list[int]] | None = None


@dataclass(frozen=True)
class StreamRecord(StreamSummary):
    """A finished stream's record (stream.json, sealed): its summary in index.json, and its units."""

    units: list[dict[str, Any]] = field(default_factory=list)
    last_unit_docs: int = 0


TokenFileEntry = ShardRecord | HoldoutEntry  # index.json's entry of a token file: a train shard or a holdout
