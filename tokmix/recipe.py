"""The recipe: parse a TOML file, validate it with clear messages, derive blocks and per-stream budgets,
and fingerprint what determines the output so a resume with a changed recipe can be refused."""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tokmix.errors import TokmixError
from tokmix.shards import EOT_TOKEN, check_input_file, shard_blocks, tokens_in_shard

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BACKEND_NAMES = ("auto", "hf", "tiktoken", "fastokens", "sentencepiece")
SHARE_TOLERANCE = 1e-6


class _Strict(BaseModel):
    # strict: a recipe's numbers and switches are TOML's own types. Without it "0.5" passes for a share and
    # `true` for seq_len 1 (a bool is an int to Python); an int still passes for a float
    model_config = ConfigDict(extra="forbid", strict=True)


# the default bound of a trained tokenizer's distinct words (bytes; docs/benchmarks.md measures the trainer on it)
DEFAULT_MAX_WORD_BYTES = 9 << 20


class TokenizerTrain(_Strict):
    vocab_size: int = Field(gt=256)
    min_frequency: int = Field(default=2, ge=1)
    # text to learn from, in characters; each stream gives its share
    max_bytes: int = Field(default=256 << 20, gt=0)
    # bytes of distinct words to learn from (tokmix.tokenizer.DistinctWords), all streams together: the
    # trainer's tables grow with them, not with the text; the default fits the default 1 GiB budget
    max_word_bytes: int = Field(default=DEFAULT_MAX_WORD_BYTES, gt=0)


def is_tiktoken_file(source: str) -> bool:
    """A tiktoken source that is a file (else it is an encoding name such as "cl100k_base"): a name with a dot or
    a folder; a file's name need not end in .tiktoken (Llama 3's ranks are `tokenizer.model`), an encoding's
    has no dot."""
    return "." in source or "/" in source or "\\" in source


REFERENCE_PREFIX = [EOT_TOKEN]  # the reference's layout: its end-of-text token before each document


class TokenizerSpec(_Strict):
    path: str | None = None  # a tokenizer.json: local path or fsspec URL
    train: TokenizerTrain | None = None
    hf: str | None = None  # a Hugging Face Hub repository ("org/name") whose tokenizer.json is used
    tiktoken: str | None = None  # tiktoken ranks: a .tiktoken file, or the name of a tiktoken encoding
    tiktoken_pattern: str | None = None  # the split regex for a .tiktoken file (default: GPT-2's)
    sentencepiece: str | None = None  # a SentencePiece .model: local path or fsspec URL
    backend: Literal["auto", "hf", "tiktoken", "fastokens", "sentencepiece"] = "auto"
    dtype: Literal["auto", "uint16", "uint32"] = "auto"
    # the special tokens, by name, written before and after every document's text (each at its own id)
    doc_prefix: list[str] = Field(default_factory=lambda: list(REFERENCE_PREFIX))
    doc_suffix: list[str] = Field(default_factory=list)

    @field_validator("doc_prefix", "doc_suffix", mode="before")
    @classmethod
    def _one_or_more(cls, v: Any) -> Any:
        given = [v] if isinstance(v, (str, int)) else v
        ids = [x for x in given if isinstance(x, int) and not isinstance(x, bool)] if isinstance(given, list) else []
        if ids:
            # an id means another token in each tokenizer (Mistral's 1 is <s>, GPT-2's 1 is '"'): names only
            raise ValueError(f"name the special tokens, not their ids (got {json.dumps(ids[0])}): e.g. "
                             "\"<|endoftext|>\" or \"<s>\"; each is written at the id its tokenizer gives it")
        return given

    @model_validator(mode="after")
    def _delimited(self) -> TokenizerSpec:
        if not self.doc_prefix and not self.doc_suffix:
            raise ValueError("give at least one token in tokenizer.doc_prefix or tokenizer.doc_suffix: "
                             "without one, documents cannot be told apart")
        if any(not name for name in self.doc_prefix + self.doc_suffix):
            raise ValueError("an empty token name in tokenizer.doc_prefix or tokenizer.doc_suffix")
        # the marker is the one token that shows where documents meet: it must not occur anywhere else
        marker, others, key = ((self.doc_prefix[0], self.doc_prefix[1:] + self.doc_suffix, "doc_prefix[0]")
                               if self.doc_prefix else (self.doc_suffix[-1], self.doc_suffix[:-1], "doc_suffix[-1]"))
        if marker in others:
            raise ValueError(f"tokenizer.{key} {marker!r} marks where documents meet, so it cannot also be "
                             "another of the delimiters")
        return self

    @model_validator(mode="after")
    def _one_source(self) -> TokenizerSpec:
        given = [self.path, self.train, self.hf, self.tiktoken, self.sentencepiece]
        if sum(x is not None for x in given) != 1:
            raise ValueError("give exactly one of tokenizer.path, tokenizer.hf, tokenizer.tiktoken, "
                             "tokenizer.sentencepiece and [tokenizer.train]")
        if self.tiktoken_pattern is not None and not (self.tiktoken and is_tiktoken_file(self.tiktoken)):
            raise ValueError("tokenizer.tiktoken_pattern goes with a .tiktoken file (an encoding has its own)")
        if self.tiktoken_pattern == "":  # (it read as GPT-2's, the default, unsaid)
            raise ValueError("tokenizer.tiktoken_pattern is empty: leave it out for GPT-2's pattern")
        return self

    @property
    def format(self) -> str:
        """The format of the tokenizer file the run reads, which decides its oracle (tokmix.backends.ORACLE)."""
        return "tiktoken" if self.tiktoken is not None else "sentencepiece" if self.sentencepiece else "hf"

    @property
    def fetched(self) -> bool:
        """Whether the run keeps its own copy of the tokenizer (a URL's, tiktoken's ranks, a trained one) in its
        output directory (Layout.own_tokenizer), instead of reading it where the recipe says."""
        given = self.path or self.sentencepiece
        return self.train is not None or self.tiktoken is not None or (given is not None and "://" in given)


class LayoutSpec(_Strict):
    seq_len: int = Field(default=1024, gt=0)
    steps: int = Field(gt=0)
    seqs_per_step: int = Field(gt=0)
    margin_steps: int = Field(default=0, ge=0)
    shard_tokens: int = Field(default=500_000_000, gt=0)
    stream_slack: float = Field(default=1.002, ge=1.0)
    blocks: int | None = Field(default=None, gt=0)
    # how documents are interleaved: "global" is the reference's one shuffle of a label per document (1 byte per
    # document in one process); "chunked" shuffles chunks of ~1M documents, each with every stream's share;
    # "balanced" keeps every stream within one document of its target at every document boundary
    interleave: Literal["global", "chunked", "balanced"] = "global"
    # a provenance index beside every train shard and holdout (tokmix.provenance): each document's source, place
    # and text checksum; off, the units skip hashing their texts and no .docs file is written
    provenance: bool = True

    @model_validator(mode="after")
    def _shard_holds_a_block(self) -> LayoutSpec:
        if self.shard_tokens < self.seq_len:
            raise ValueError(f"shard_tokens ({self.shard_tokens:,}) is smaller than one block ({self.seq_len})")
        return self


class HoldoutSpec(_Strict):
    tokens: int = Field(gt=0)
    eval_windows: int = Field(ge=0)
    splits: str = "file_splits.json"
    holdout_files: int = Field(default=1, ge=1)
    decontaminate: bool = True


class StreamSpec(_Strict):
    domain: str = Field(min_length=1)
    share: float | None = None  # None only with a [[schedule]], whose phases give the shares
    files: list[str] = Field(min_length=1)
    text_field: str = "text"
    # a field (JSONL) or column (parquet) holding each document's own id, a string or an integer: kept beside
    # the provenance index (train_000.ids), shown by `tokmix trace` and looked up with `trace --id`
    id_field: str | None = Field(default=None, min_length=1)
    # passes over the train documents the stream may make when they hold fewer tokens than its budget; each
    # pass after the first in a seeded order of its own (tokmix.stages.streams)
    max_epochs: int = Field(default=1, ge=1)
    # which of the stream's files the split file holds out when it is created: a count of its last files, or
    # files/globs by name; or a fraction of its files. None: [holdout] holdout_files.
    holdout_files: int | list[str] | None = None
    holdout_fraction: float | None = Field(default=None, gt=0, lt=1)

    @model_validator(mode="after")
    def _one_holdout_rule(self) -> StreamSpec:
        if self.holdout_files is not None and self.holdout_fraction is not None:
            raise ValueError("give holdout_files or holdout_fraction, not both")
        if isinstance(self.holdout_files, int) and self.holdout_files < 1:
            raise ValueError(f"holdout_files must be at least 1, got {self.holdout_files}")
        if isinstance(self.holdout_files, list) and not (self.holdout_files and all(self.holdout_files)):
            raise ValueError("holdout_files: name at least one file, and no empty name")
        return self

    @field_validator("share")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ValueError(f"share must be a positive number, got {v}")
        return v


class PhaseSpec(_Strict):
    """One phase of a [[schedule]]: its steps (of layout.steps, in order), every stream's share in it (a stream
    it does not name has 0), and the steps over which the shares move linearly from the previous phase's."""

    name: str = Field(min_length=1)
    steps: int = Field(gt=0)
    shares: dict[str, float] = Field(min_length=1)
    ramp_steps: int = Field(default=0, ge=0)
    # a long-context phase: its own block length; its sequences per step default to the layout's tokens per
    # step over it (so a step holds the same tokens)
    seq_len: int | None = Field(default=None, gt=0)
    seqs_per_step: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _valid(self) -> PhaseSpec:
        if not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"phase name {self.name!r}: use letters, digits, '_' and '-' only")
        for stream, share in self.shares.items():
            if not (share >= 0 and math.isfinite(share)):
                raise ValueError(f"phase {self.name}: share of {stream} must be a number >= 0, got {share}")
        total = sum(self.shares.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            shares = ", ".join(f"{n} {v}" for n, v in self.shares.items())
            raise ValueError(f"phase {self.name}: shares sum to {total:.6g}, not 1 ({shares})")
        if self.ramp_steps > self.steps:
            raise ValueError(f"phase {self.name}: ramp_steps {self.ramp_steps} is more than its {self.steps} steps")
        return self


@dataclass(frozen=True)
class Phase:
    """A phase of the run as laid out in blocks: its steps then its own margin_steps (a NaN guard's skip in a
    phase takes the phase's own spare blocks, never another phase's), every stream's share once its ramp is
    over, and where it starts among the run's logical steps, blocks and tokens. A recipe without a schedule is
    one phase of the streams' shares."""

    name: str
    first_step: int
    steps: int
    margin_steps: int
    ramp_steps: int
    seqs_per_step: int
    seq_len: int
    first_block: int
    first_token: int
    shares: tuple[float, ...]  # recipe order
    previous: tuple[float, ...]  # the shares the ramp starts from (the previous phase's)

    @property
    def blocks(self) -> int:
        return (self.steps + self.margin_steps) * self.seqs_per_step

    @property
    def tokens(self) -> int:
        return self.blocks * self.seq_len

    def pieces(self) -> list[tuple[int, tuple[float, ...]]]:
        """The phase's shares along its tokens: one piece per ramp step (the share at the step's middle, so the
        integral is the linear ramp's), then one for the rest."""
        step_tokens = self.seqs_per_step * self.seq_len
        out = []
        for t in range(self.ramp_steps):
            f = (t + 0.5) / self.ramp_steps
            out.append((self.first_token + t * step_tokens,
                        tuple(a + (b - a) * f for a, b in zip(self.previous, self.shares))))
        out.append((self.first_token + self.ramp_steps * step_tokens, self.shares))
        return out

    def integral(self) -> list[float]:
        """Every stream's target tokens over the phase's blocks."""
        step_tokens = self.seqs_per_step * self.seq_len
        ramp, rest = self.ramp_steps * step_tokens, self.tokens - self.ramp_steps * step_tokens
        return [ramp * (a + b) / 2 + rest * b for a, b in zip(self.previous, self.shares)]


class BenchmarkSpec(_Strict):
    files: list[str] = Field(min_length=1)  # local paths, globs or fsspec URLs: JSONL (.gz, .zst), parquet, text
    fields: list[str] = Field(default_factory=lambda: ["text"], min_length=1)  # joined, in this order
    id_field: str | None = None  # the item's own id (HumanEval's task_id); without it, its index


class DecontaminateSpec(_Strict):
    """[decontaminate]: training documents sharing `min_matches` word n-grams with a benchmark item dropped
    (or only counted) before tokenization (tokmix.stages.decontam)."""

    ngram: int = Field(default=13, ge=1, le=64)  # words, after normalization (tokmix.ngrams)
    min_matches: int = Field(default=1, ge=1)  # distinct n-grams a document shares with one item
    action: Literal["drop", "report"] = "drop"
    benchmarks: dict[str, BenchmarkSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _names(self) -> DecontaminateSpec:
        for name in self.benchmarks:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"benchmark name {name!r}: use letters, digits, '_' and '-' only")
        return self


class Recipe(_Strict):
    seed: int = Field(ge=0, lt=1 << 64)  # numpy's default_rng takes a non-negative seed; the reference's are 64-bit
    tokenizer: TokenizerSpec
    layout: LayoutSpec
    holdout: HoldoutSpec
    streams: dict[str, StreamSpec] = Field(min_length=1)
    # phases in step order, each with its own shares, instead of the streams' share (docs/recipe.md)
    schedule: list[PhaseSpec] = Field(default_factory=list)
    decontaminate: DecontaminateSpec | None = None
    base_dir: Path = Field(default=Path("."), exclude=True)

    @model_validator(mode="after")
    def _shares_sum_to_one(self) -> Recipe:
        if self.schedule:
            self._check_schedule()
            return self._check_names()
        missing = [n for n, s in self.streams.items() if s.share is None]
        if missing:
            raise ValueError(f"stream {missing[0]} has no share (give one, or give the shares in [[schedule]])")
        total = sum(s.share for s in self.streams.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            shares = ", ".join(f"{n} {s.share}" for n, s in self.streams.items())
            raise ValueError(f"stream shares sum to {total:.6g}, not 1 ({shares})")
        return self._check_names()

    def _check_names(self) -> Recipe:
        for name in self.streams:
            if not name.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"stream name {name!r}: use letters, digits, '_' and '-' only")
        for domain in self.domains:
            if not domain.replace("_", "").replace("-", "").isalnum():
                raise ValueError(f"domain name {domain!r}: use letters, digits, '_' and '-' only")
        keyed = [n for n, s in self.streams.items() if s.id_field is not None]
        if keyed and not self.layout.provenance:
            raise ValueError(f"streams.{keyed[0]}.id_field: documents' ids are kept in the provenance index, which "
                             "[layout] provenance = false turns off")
        return self

    def _check_schedule(self) -> None:
        if self.layout.interleave != "balanced":
            raise ValueError('a [[schedule]] needs [layout] interleave = "balanced": the global and chunked '
                             "orders draw every document from one fixed mix, and could not follow the phases")
        given = [n for n, s in self.streams.items() if s.share is not None]
        if given:
            raise ValueError(f"stream {given[0]} has a share and the recipe a [[schedule]]: give the shares in "
                             "the schedule's phases only")
        if self.layout.blocks is not None:
            raise ValueError("layout.blocks with a [[schedule]]: the phases' steps decide the blocks")
        steps = sum(p.steps for p in self.schedule)
        if steps != self.layout.steps:
            raise ValueError(f"the schedule's phases have {steps:,} steps, layout.steps is {self.layout.steps:,}")
        names = [p.name for p in self.schedule]
        if len(set(names)) != len(names):
            raise ValueError(f"two phases are named {next(n for n in names if names.count(n) > 1)!r}")
        if self.schedule[0].ramp_steps:
            raise ValueError(f"phase {names[0]}: the first phase has no previous one to ramp from (ramp_steps 0)")
        for phase in self.schedule:
            seq_len = phase.seq_len or self.layout.seq_len
            step_tokens = self.layout.seqs_per_step * self.layout.seq_len
            if phase.seqs_per_step is None and step_tokens % seq_len:
                raise ValueError(f"phase {phase.name}: seq_len {seq_len:,} does not divide a step's "
                                 f"{step_tokens:,} tokens (seqs_per_step x seq_len): give the phase's seqs_per_step")
            if self.layout.shard_tokens < seq_len:
                raise ValueError(f"phase {phase.name}: shard_tokens ({self.layout.shard_tokens:,}) is smaller than "
                                 f"one of its blocks ({seq_len:,})")
            unknown = [n for n in phase.shares if n not in self.streams]
            if unknown:
                raise ValueError(f"phase {phase.name}: {unknown[0]!r} is not a stream of the recipe "
                                 f"({', '.join(self.streams)})")
        for name in self.streams:
            if not any(p.shares.get(name, 0) > 0 for p in self.schedule):
                raise ValueError(f"stream {name} has share 0 in every phase of the schedule")

    @property
    def id_fields(self) -> dict[str, str]:
        """The streams whose documents' ids are kept, and the field each is read from."""
        return {n: s.id_field for n, s in self.streams.items() if s.id_field is not None}

    # ------------------------------------------------------------------ derived numbers
    @property
    def default_blocks(self) -> int:
        if self.schedule:
            return sum(p.blocks for p in self.phases)
        return (self.layout.steps + self.layout.margin_steps) * self.layout.seqs_per_step

    @property
    def phases(self) -> list[Phase]:
        """The run's phases in order: the schedule's, or one phase of the streams' shares."""
        layout, names = self.layout, list(self.streams)
        specs = self.schedule or [None]
        out: list[Phase] = []
        step = block = token = 0
        for spec in specs:
            shares = (tuple(float(spec.shares.get(n, 0.0)) for n in names) if spec is not None
                      else tuple(s.share for s in self.streams.values()))
            seq_len = (spec.seq_len if spec else None) or layout.seq_len
            seqs = ((spec.seqs_per_step if spec else None)
                    or layout.seqs_per_step * layout.seq_len // seq_len)
            phase = Phase(spec.name if spec is not None else "main", step, spec.steps if spec else layout.steps,
                          layout.margin_steps, spec.ramp_steps if spec else 0, seqs, seq_len, block, token, shares,
                          out[-1].shares if out else shares)
            out.append(phase)
            step, block, token = step + phase.steps, block + phase.blocks, token + phase.tokens
        return out

    @property
    def blocks(self) -> int:
        return self.layout.blocks or self.default_blocks

    @property
    def train_tokens(self) -> int:
        """Tokens of the whole train run: the blocks plus the one token the last block reads past them."""
        if self.schedule:
            return sum(p.tokens for p in self.phases) + 1
        return tokens_in_shard(self.blocks, self.layout.seq_len)

    @property
    def blocks_per_shard(self) -> int:
        return self.layout.shard_tokens // self.layout.seq_len

    @property
    def shard_blocks(self) -> list[int]:
        """Blocks of each train shard: full shards of blocks_per_shard, then the remainder; with a schedule,
        phase by phase (a shard holds one phase's blocks only)."""
        if self.schedule:
            return [b for p in self.phases for b in shard_blocks(p.blocks, self.layout.shard_tokens // p.seq_len)]
        return shard_blocks(self.blocks, self.blocks_per_shard)

    @property
    def shard_seq_lens(self) -> list[int]:
        """The block length of each train shard: the layout's, or its phase's."""
        if self.schedule:
            return [p.seq_len for p in self.phases
                    for _ in shard_blocks(p.blocks, self.layout.shard_tokens // p.seq_len)]
        return [self.layout.seq_len] * len(self.shard_blocks)

    @property
    def shard_tokens_list(self) -> list[int]:
        """Tokens of each train shard (blocks x its seq_len + 1)."""
        return [tokens_in_shard(b, s) for b, s in zip(self.shard_blocks, self.shard_seq_lens)]

    def budget(self, stream: str) -> int:
        """Tokens stream `stream` collects: its share of the run plus slack, so assembly never runs short (with
        a schedule: the integral of its share over the phases, times the slack)."""
        if self.schedule:
            return int(self.target_tokens()[list(self.streams).index(stream)] * self.layout.stream_slack) + 1
        return int(self.streams[stream].share * self.train_tokens * self.layout.stream_slack) + 1

    def target_tokens(self) -> list[float]:
        """Every stream's target tokens over the whole run (the run's last token at the last phase's shares)."""
        phases = self.phases
        totals = [sum(col) for col in zip(*(p.integral() for p in phases))]
        return [t + s for t, s in zip(totals, phases[-1].shares)]

    def share(self, stream: str) -> float:
        """The stream's share of the whole run: its recipe share, or with a schedule its target tokens over the
        run's."""
        if not self.schedule:
            return self.streams[stream].share
        return self.target_tokens()[list(self.streams).index(stream)] / self.train_tokens

    @property
    def mix_pieces(self) -> tuple[tuple[int, ...], tuple[tuple[float, ...], ...]]:
        """Every stream's target share along the run, as pieces (start token, shares in recipe order): the
        balanced interleave's targets (tokmix.interleave.Mix)."""
        pieces = [piece for phase in self.phases for piece in phase.pieces()]
        return tuple(p for p, _ in pieces), tuple(s for _, s in pieces)

    @property
    def phase_positions(self) -> tuple[int, ...]:
        """The token position where each phase of the schedule ends (none without a schedule); the last phase
        ends with the run's last token."""
        if not self.schedule:
            return ()
        return (*(p.first_token + p.tokens for p in self.phases[:-1]), self.train_tokens)

    @property
    def domains(self) -> list[str]:
        """Domains in the order their first stream appears in the recipe."""
        return list(dict.fromkeys(s.domain for s in self.streams.values()))

    def streams_of(self, domain: str) -> list[str]:
        return [n for n, s in self.streams.items() if s.domain == domain]

    def resolve(self, path: str) -> str:
        """A recipe path: URLs as given, local paths relative to the recipe's directory. A file:// URL is a local
        path (every reader of a local file then takes it, and a run names it one way)."""
        path = path.removeprefix("file://")
        if "://" in path or Path(path).is_absolute():
            return path
        return str(self.base_dir / path)

    @property
    def tokenizer_path(self) -> str | None:
        given = self.tokenizer.path or self.tokenizer.sentencepiece
        return self.resolve(given) if given else None

    @property
    def splits_path(self) -> str:
        return self.resolve(self.holdout.splits)

    # ------------------------------------------------------------------ identity
    def output_fields(self) -> dict[str, Any]:
        """Everything that can change the bytes written, with paths resolved (a moved recipe file with the
        same sources is the same run)."""
        data = self.model_dump(mode="json")
        data["tokenizer"]["path"] = self.resolve(self.tokenizer.path) if self.tokenizer.path else None
        if self.tokenizer.sentencepiece:
            data["tokenizer"]["sentencepiece"] = self.tokenizer_path
        for key in ("hf", "tiktoken", "tiktoken_pattern", "sentencepiece"):  # absent before these keys existed
            if data["tokenizer"][key] is None:
                data["tokenizer"].pop(key)
        if self.tokenizer.tiktoken and is_tiktoken_file(self.tokenizer.tiktoken):
            data["tokenizer"]["tiktoken"] = self.resolve(self.tokenizer.tiktoken)
        data["tokenizer"].pop("backend")  # every backend gives identical ids
        train = data["tokenizer"].get("train")
        if train is not None and train["max_word_bytes"] == DEFAULT_MAX_WORD_BYTES:
            del train["max_word_bytes"]  # absent before the key existed: those runs' fingerprints stay
        for key, default in (("doc_prefix", REFERENCE_PREFIX), ("doc_suffix", [])):
            if data["tokenizer"][key] == default:  # absent before these keys existed: runs from then still resume
                data["tokenizer"].pop(key)
        data["holdout"]["splits"] = self.splits_path
        data["layout"]["blocks"] = self.blocks
        if data["layout"]["interleave"] == "global":
            del data["layout"]["interleave"]  # the default: fingerprints of recipes written before it stay
        if data["layout"]["provenance"]:
            del data["layout"]["provenance"]  # likewise; off, a resume that would turn it on is refused (no .src)
        if not data["schedule"]:
            del data["schedule"]  # absent before schedules existed: fingerprints of recipes without one stay
        if self.decontaminate is None:
            del data["decontaminate"]  # absent before the key existed: those runs' fingerprints stay
        else:
            for name, bench in data["decontaminate"]["benchmarks"].items():
                bench["files"] = [self.resolve(f) for f in self.decontaminate.benchmarks[name].files]
        for name, stream in data["streams"].items():
            if stream["share"] is None:
                del stream["share"]
            stream["files"] = [self.resolve(f) for f in self.streams[name].files]
            # max_epochs only allows passes, the budget and seed decide them: raising it after a run ran out
            # resumes that run instead of being refused as a change
            stream.pop("max_epochs")
            for key in ("holdout_files", "holdout_fraction", "id_field"):  # unset: a run recorded before these existed
                if stream[key] is None:
                    stream.pop(key)
        return data

    def fingerprint(self) -> str:
        blob = json.dumps(self.output_fields(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def with_blocks(self, blocks: int | None) -> Recipe:
        if blocks is None:
            return self
        if self.schedule:
            raise TokmixError("--blocks with a [[schedule]]: the phases' steps decide the blocks")
        layout = self.layout.model_copy(update={"blocks": blocks})
        return self.model_copy(update={"layout": layout})

    def with_backend(self, backend: str | None) -> Recipe:
        if backend is None:
            return self
        if backend not in BACKEND_NAMES:
            raise TokmixError(f"unknown tokenizer backend {backend!r}; choose one of {', '.join(BACKEND_NAMES)}")
        spec = self.tokenizer.model_copy(update={"backend": backend})
        return self.model_copy(update={"tokenizer": spec})


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The recipe's table (a model) that holds the key at `loc`, e.g. ("streams", "web", "txt_field") ->
    StreamSpec; None where `loc` is not inside a table."""
    model, parts = Recipe, list(loc[:-1])
    while parts:
        info = model.model_fields.get(str(parts.pop(0)))
        if info is None:
            return None
        annotation, keyed = info.annotation, False
        if get_origin(annotation) is dict:  # [streams.NAME]: the next part is the user's name
            annotation, keyed = get_args(annotation)[1], True
        tables = [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not tables:
            return None
        model = tables[0]
        if keyed and parts:
            parts.pop(0)
    return model


def unknown_key(loc: tuple) -> str:
    """'unknown key' with the nearest key the table takes (or all of them when none is near)."""
    model = _model_at(loc)
    if model is None:
        return "unknown key"
    keys = [k for k, f in model.model_fields.items() if not f.exclude]
    near = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.5)
    table = ".".join(str(p) for p in loc[:-1]) or "the recipe's top level"
    if near:
        return f"unknown key; did you mean {near[0]!r}? ({table} takes {', '.join(keys)})"
    return f"unknown key ({table} takes {', '.join(keys)})"


def _describe(error: ValidationError, source: str) -> str:
    errors = error.errors()
    # an unknown key first: a misspelt key is also reported as its real name missing, which the spelling explains
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where = ".".join(str(p) for p in first["loc"]) or "recipe"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = unknown_key(first["loc"])
    if first["type"].endswith("_type") or first["type"].endswith("_parsing"):  # strict types: show what was given
        message += f", got {json.dumps(first['input'], default=str)}"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{source}: {where}: {message}{more}"


def recipe_from_dict(data: dict[str, Any], base_dir: Path, source: str = "recipe") -> Recipe:
    try:
        return Recipe.model_validate({**data, "base_dir": base_dir})
    except ValidationError as e:
        raise TokmixError(_describe(e, source)) from None


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe file; relative paths in it are relative to its directory."""
    path = Path(path)
    try:
        if not path.is_dir():  # a FIFO or a device is named, never opened (reading it could block or never end)
            check_input_file(path)
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TokmixError(f"{path}: recipe file not found") from None
    except IsADirectoryError:
        raise TokmixError(f"{path}: is a directory, not a recipe file") from None
    except OSError as e:
        raise TokmixError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise TokmixError(f"{path}: not a recipe: byte {e.start} is not UTF-8 text (a TOML file is)") from None
    except tomllib.TOMLDecodeError as e:
        raise TokmixError(f"{path}: not valid TOML: {e}") from None
    return recipe_from_dict(data, path.resolve().parent, str(path))


def recipe_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Readable lines of what changed between two `output_fields()` dicts."""
    lines = []
    for key in sorted(set(old) | set(new)):
        where = f"{prefix}{key}"
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += recipe_diff(a, b, where + ".")
        elif a != b:
            lines.append(f"{where}: {json.dumps(a)} -> {json.dumps(b)}")
    return lines
