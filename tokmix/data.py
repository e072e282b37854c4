"""The training side of an output directory: the blocks of each step and rank for a training loop (resumable,
with the NaN guard's skips), and the holdout windows an evaluator turns into bits per byte. It imports numpy,
the stdlib and tokmix.shards alone, so a training job never pulls in pyarrow, tokenizers or Ray.

Batches are int64: torch's embedding and cross-entropy take int64 ids as they are, and a copy out of the
memory map happens anyway, so widening there costs nothing extra.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tokmix import shards
from tokmix.errors import TokmixError
from tokmix.format.records import HoldoutEntry, Index, PhaseEntry
from tokmix.provenance import RunDocuments
from tokmix.store import as_path, storage
from tokmix.tokens import read_array, read_tokens

BATCH_DTYPE = np.int64
STATE_VERSION = 1

Batch = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Segments:
    """Where documents meet in a batch's x (rows of seq_len tokens), for attention that stays inside a document
    (flash-attn's varlen functions, a block-diagonal mask): a row's first segment starts at its first token
    (inside a document or at its start), then one starts at every document start in the row.

    - `starts[r]`: offsets in row r where its segments start (int64, first 0);
    - `cu_seqlens`: int32 cumulative segment lengths over the batch flattened row after row (a row's end is a
      segment's end), 0 first and rows * seq_len last: flash_attn_varlen_func's cu_seqlens;
    - `max_seqlen`: the longest segment;
    - `position_ids`: int64 (rows, seq_len), 0 at each segment's start, counting up to its end."""

    starts: list[np.ndarray]
    cu_seqlens: np.ndarray
    max_seqlen: int
    position_ids: np.ndarray


def segments_of(starts: list[np.ndarray], seq_len: int) -> Segments:
    """Segments from each row's segment starts."""
    ends = [np.append(s[1:], seq_len) + r * seq_len for r, s in enumerate(starts)]  # each segment's end
    cu = np.concatenate([[0], *ends]).astype(np.int32)
    positions = np.empty((len(starts), seq_len), dtype=np.int64)
    for r, s in enumerate(starts):
        lengths = np.diff(np.append(s, seq_len))
        positions[r] = np.arange(seq_len) - np.repeat(s, lengths)
    return Segments(starts, cu, int(np.diff(cu).max()) if len(cu) > 1 else 0, positions)


def read_run_index(out_dir: str | os.PathLike) -> Index:
    """index.json of a finished run, or a TokmixError saying what is missing."""
    index = shards.read_index(out_dir)
    if not index:
        raise TokmixError(
            f"{out_dir}: no {shards.INDEX_NAME} (not a tokmix output directory, or the run has not started)"
        )
    for key in ("dtype", "seq_len"):
        if key in index.absent:
            raise TokmixError(f"{out_dir}/{shards.INDEX_NAME} has no {key!r}: the run has not finished")
    seq_len = int(index.seq_len)
    # the readers below hard-code the block layout; refuse an index that says otherwise
    block = shards.block_tokens(seq_len)
    if index.block not in (None, block) or index.stride not in (None, seq_len):
        raise TokmixError(
            f"{out_dir}/{shards.INDEX_NAME}: block {index.block} / stride {index.stride} do not "
            f"match seq_len {seq_len} (expected block = seq_len + 1, stride = seq_len)"
        )
    return index


def check_token_file(path: Path, tokens: int, dtype: np.dtype) -> None:
    """A token file must hold exactly the tokens the index records; a short one means a broken copy."""
    if not path.is_file():
        raise TokmixError(f"{path}: missing (listed in {shards.INDEX_NAME})")
    size, want = path.stat().st_size, tokens * dtype.itemsize
    if size != want:
        raise TokmixError(
            f"{path}: {size:,} bytes, but {shards.INDEX_NAME} records {tokens:,} {dtype.name} tokens ({want:,} bytes)"
        )


def bits_per_byte(sum_nll_nats: float, eval_bytes: int) -> float:
    """Summed next-token loss (natural log) over a holdout's eval targets, in bits per UTF-8 byte of text."""
    return sum_nll_nats / math.log(2) / eval_bytes


class TrainBlocks:
    """The run's train blocks, step by step. Step s is global blocks [s*B, (s+1)*B) with B = seqs_per_step, in
    order; rank r of W takes the contiguous slice [s*B + r*B/W, s*B + (r+1)*B/W), so the blocks of a step and
    their order do not depend on the world size. After `skip(n)`, logical step s reads physical step s + n."""

    def __init__(self, out_dir: str | os.PathLike, rank: int = 0, world_size: int = 1):
        self.root = as_path(out_dir)  # a local directory, or a store's URL (s3://, gs://) read through fsspec
        self.index = index = read_run_index(self.root)
        for key in ("shards", "seqs_per_step", "train_steps"):
            if not getattr(index, key):
                raise TokmixError(f"{self.root}/{shards.INDEX_NAME} has no {key!r}: the run has not finished")
        self.dtype = np.dtype(index.dtype)
        self.seq_len = int(index.seq_len)
        self.seqs_per_step = int(index.seqs_per_step)
        self.train_steps = int(index.train_steps)
        self.margin_steps = int(index.margin_steps)
        self.files = [self.root / s.file for s in index.shards]
        counts = [int(s.blocks) for s in index.shards]
        # each shard's block length: the run's, or (a long-context phase) its phase's
        self.shard_seq_len = [int(s.seq_len or self.seq_len) for s in index.shards]
        for path, s, n, S in zip(self.files, index.shards, counts, self.shard_seq_len):
            if int(s.tokens) != shards.tokens_in_shard(n, S):
                raise TokmixError(f"{path}: {s.tokens:,} tokens recorded for {n:,} blocks of {S}")
            check_token_file(path, int(s.tokens), self.dtype)
        # first global block of each shard; the last entry is the number of blocks of the run
        self.first_block = np.cumsum([0, *counts])
        self.blocks = int(self.first_block[-1])
        if index.blocks is not None and int(index.blocks) != self.blocks:
            raise TokmixError(f"{self.root}: shards hold {self.blocks:,} blocks, index says {index.blocks:,}")
        # a schedule's phases (index.json `phases`): each has its own steps and margin; none: the run is one
        self.phases: list[PhaseEntry] = list(index.phases or [])
        self.rank, self.world_size = rank, world_size
        self._rank_slice(rank, world_size)  # fail now, not at the first batch
        self.step = 0  # the next logical step that iteration yields
        self.skipped = 0  # steps skipped so far: logical step s reads physical step s + skipped
        self.skip_phase = 0  # with phases: the phase `skipped` counts in (a later phase starts with its own margin)
        self._tokens: list[np.ndarray | None] = [None] * len(self.files)
        self._documents: RunDocuments | None = None  # the provenance index, read on first use

    # ------------------------------------------------------------------ blocks
    def _shard(self, k: int) -> np.ndarray:
        if self._tokens[k] is None:  # opened on first use, so a pickled loader carries no data
            self._tokens[k] = read_tokens(self.files[k], self.dtype)
        return self._tokens[k]

    def locate(self, j: int) -> tuple[int, int]:
        """(shard number, first token) of global block j."""
        if not 0 <= j < self.blocks:
            raise TokmixError(f"block {j} does not exist: the run has {self.blocks:,} blocks")
        k = int(np.searchsorted(self.first_block, j, side="right")) - 1
        return k, (j - int(self.first_block[k])) * self.shard_seq_len[k]

    def _span(self, k: int, start: int, count: int) -> np.ndarray:
        """`count` tokens of shard k from token `start`: a slice of the local file's mapping, or one ranged read
        of the object on a store (a shard is never fetched whole: a step reads the bytes of its blocks only)."""
        if storage(self.files[k]).remote:
            return read_array(self.files[k], self.dtype, start, count)
        return self._shard(k)[start : start + count]

    def block(self, j: int) -> np.ndarray:
        """Global block j as stored: seq_len + 1 tokens of the shard dtype."""
        k, start = self.locate(j)
        return np.array(self._span(k, start, shards.block_tokens(self.shard_seq_len[k])))

    def _fill(self, first: int, count: int, x: np.ndarray, y: np.ndarray) -> None:
        """Blocks [first, first + count) into x and y. Consecutive blocks of one shard are one contiguous span of
        count*seq_len + 1 tokens, so each shard touched is a single slice; a span crosses shards at most a few times."""
        row, j, end = 0, first, first + count
        while j < end:
            k, start = self.locate(j)
            S = self.shard_seq_len[k]
            n = min(end, int(self.first_block[k + 1])) - j
            span = self._span(k, start, n * S + 1)
            x[row : row + n] = span[:-1].reshape(n, S)
            y[row : row + n] = span[1:].reshape(n, S)
            row, j = row + n, j + n

    # ------------------------------------------------------------------ steps and ranks
    def _rank_slice(self, rank: int, world_size: int, seqs: int | None = None) -> tuple[int, int]:
        seqs = self.seqs_per_step if seqs is None else seqs
        for n in {seqs, *(p.seqs_per_step for p in self.phases)}:
            if world_size < 1 or n % world_size:
                raise TokmixError(
                    f"world_size {world_size} does not divide seqs_per_step {n}: "
                    "every rank must take the same number of blocks per step"
                )
        if not 0 <= rank < world_size:
            raise TokmixError(f"rank {rank} is outside world_size {world_size}")
        per_rank = seqs // world_size
        return rank * per_rank, per_rank

    @property
    def physical_steps(self) -> int:
        """Whole steps the shards hold: train_steps + margin_steps for a full run."""
        return self.blocks // self.seqs_per_step

    @property
    def steps(self) -> int:
        """Logical steps iteration yields: train_steps, or fewer if a short run's shards (or skips) run out
        (a phased run always holds all of its phases' steps)."""
        if self.phases:
            return self.train_steps
        return max(0, min(self.train_steps, self.physical_steps - self.skipped))

    def step_blocks(self, step: int, rank: int | None = None, world_size: int | None = None) -> range:
        """The global blocks of logical `step` for one rank, in the order of its batch's rows. rank and world_size
        default to the loader's own."""
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        if step < 0:
            raise TokmixError(f"step {step} is negative")
        if self.phases:  # the phase's own sequences per step (a long-context phase: fewer, longer)
            seqs = self.phases[self.phase_number(step)].seqs_per_step
            return self._phase_blocks(step, *self._rank_slice(rank, world_size, seqs))
        offset, per_rank = self._rank_slice(rank, world_size)
        physical = step + self.skipped
        if physical >= self.physical_steps:
            raise TokmixError(
                f"step {step}{f' (+{self.skipped} skipped)' if self.skipped else ''} is past the last block: the run "
                f"has {self.blocks:,} blocks, {self.physical_steps:,} steps of {self.seqs_per_step}"
            )
        first = physical * self.seqs_per_step + offset
        return range(first, first + per_rank)

    def block_seq_len(self, j: int) -> int:
        """The length of global block j (its shard's seq_len: a long-context phase's blocks are longer)."""
        return self.shard_seq_len[self.locate(j)[0]]

    def phase_number(self, step: int) -> int:
        """The phase (its position in index.json's `phases`) logical `step` is in; 0 for a run without phases."""
        if not 0 <= step < max(self.train_steps, 1):
            raise TokmixError(f"step {step} is outside the run's {self.train_steps:,} steps")
        for i, phase in enumerate(self.phases):
            if phase.steps[0] <= step < phase.steps[1]:
                return i
        return 0

    def phase(self, step: int) -> str | None:
        """The name of the phase logical `step` is in (None for a run without a schedule)."""
        return self.phases[self.phase_number(step)].name if self.phases else None

    def _phase_blocks(self, step: int, offset: int, per_rank: int) -> range:
        """A step of a phased run: the phase's blocks from its start, its own skips (its margin) added."""
        i = self.phase_number(step)
        phase = self.phases[i]
        physical = step - phase.steps[0] + (self.skipped if i == self.skip_phase else 0)
        first = phase.blocks[0] + physical * phase.seqs_per_step + offset
        return range(first, first + per_rank)

    def segments(self, step: int, rank: int | None = None, world_size: int | None = None) -> Segments:
        """The document segments of batch(step, rank, world_size)'s x, from the run's provenance index (not by
        looking for a delimiter id among the tokens: a document is where the index says it is)."""
        blocks = self.step_blocks(step, rank, world_size)
        return segments_of([self.block_starts(j) for j in blocks], self.block_seq_len(blocks.start))

    def block_starts(self, j: int) -> np.ndarray:
        """Where segments start among global block j's first seq_len tokens (its x): 0, then each document start."""
        k, start = self.locate(j)
        return self._run_documents().shard(k).segments(start, start + self.shard_seq_len[k])

    def _run_documents(self) -> RunDocuments:
        if self._documents is None:
            self._documents = RunDocuments(self.root, self.index)
        return self._documents

    def document_ids(self, step: int, rank: int | None = None, world_size: int | None = None) -> list[list]:
        """The own ids ([streams.X] id_field) of the documents in each row of batch(step, rank, world_size)'s x, in
        the order of segments(): one list per row, None for a document of a stream without an id_field."""
        documents, out = self._run_documents(), []
        for j in self.step_blocks(step, rank, world_size):
            k, start = self.locate(j)
            ids = documents.ids(k)
            if ids is None:
                raise TokmixError(f"{self.root}: the run kept no documents' ids (no stream has an id_field)")
            inside = documents.shard(k).overlapping(start, start + self.shard_seq_len[k])
            out.append([ids[i] for i in inside.tolist()])
        return out

    def batch(self, step: int, rank: int | None = None, world_size: int | None = None) -> Batch:
        """(x, y) of logical `step` for one rank, each int64 of shape (seqs_per_step // world_size, seq_len).
        rank and world_size default to the loader's own."""
        blocks = self.step_blocks(step, rank, world_size)
        x = np.empty((len(blocks), self.block_seq_len(blocks.start)), dtype=BATCH_DTYPE)
        y = np.empty_like(x)
        self._fill(blocks.start, len(blocks), x, y)
        return x, y

    def skip(self, n_steps: int) -> None:
        """Move past n_steps of data (the NaN guard): it consumes the margin, and is refused past it. With
        phases, each phase has its own margin: a skip takes the current phase's spare blocks, and the next phase
        starts at its own first block with its whole margin."""
        if n_steps < 0:
            raise TokmixError(f"cannot skip {n_steps} steps")
        if self.phases:  # the current phase's margin: a skip never reads another phase's blocks
            i = self.phase_number(min(self.step, self.train_steps - 1))
            if i != self.skip_phase:
                self.skip_phase, self.skipped = i, 0
            margin = self.phases[i].margin_steps
            if self.skipped + n_steps > margin:
                raise TokmixError(
                    f"cannot skip {n_steps} more steps: {self.skipped} of phase {self.phases[i].name}'s {margin} "
                    "margin steps are used, and skipping past them would read the next phase's blocks")
        elif self.skipped + n_steps > self.margin_steps:
            raise TokmixError(
                f"cannot skip {n_steps} more steps: {self.skipped} of the run's {self.margin_steps} margin steps "
                "are used, and skipping past the margin would run out of unseen blocks"
            )
        self.skipped += n_steps

    def __iter__(self) -> Iterator[Batch]:
        """Batches of this loader's rank from `self.step` on. The step counter moves before a batch is handed
        out, so a state_dict() taken while training on step s resumes at step s + 1."""
        while self.step < self.steps:
            batch = self.batch(self.step)
            self.step += 1
            yield batch

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, int]:
        """Plain ints, JSON-safe. The blocks and seqs_per_step pin the run the state belongs to."""
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "skipped": self.skipped,
            "blocks": self.blocks,
            "seqs_per_step": self.seqs_per_step,
            **({"skip_phase": self.skip_phase} if self.phases else {}),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("blocks", "seqs_per_step"):
            if key in state and int(state[key]) != getattr(self, key):
                raise TokmixError(
                    f"loader state is for a run with {key} = {state[key]:,}, this one has {getattr(self, key):,}"
                )
        skipped = int(state.get("skipped", 0))
        if not 0 <= skipped <= self.margin_steps:
            raise TokmixError(f"loader state skipped {skipped} steps; the margin is {self.margin_steps}")
        skip_phase = int(state.get("skip_phase", 0))
        if not 0 <= skip_phase < max(len(self.phases), 1):
            raise TokmixError(f"loader state skips in phase {skip_phase}; the run has {len(self.phases)} phases")
        self.step, self.skipped, self.skip_phase = int(state["step"]), skipped, skip_phase

    def __getstate__(self) -> dict[str, Any]:
        # a memmap pickles as its whole contents; a DataLoader worker reopens the files instead
        state = self.__dict__.copy()
        state["_tokens"] = [None] * len(self.files)
        state["_documents"] = None
        return state


class HoldoutWindows:
    """The eval windows of the holdouts: window i of a domain is tokens[i*S : i*S + S + 1] for i < eval_windows,
    so the windows' targets are exactly the holdout's first eval_targets targets, whose UTF-8 size is eval_bytes.
    `domain` given here is the default for the methods below."""

    def __init__(self, out_dir: str | os.PathLike, domain: str | None = None):
        self.root = as_path(out_dir)
        index = read_run_index(self.root)
        self.val: dict[str, HoldoutEntry] = index.val or {}
        if not self.val:
            raise TokmixError(f"{self.root}/{shards.INDEX_NAME} lists no holdouts")
        self.dtype = np.dtype(index.dtype)
        self.seq_len = int(index.seq_len)
        self.domain = domain
        self._tokens: dict[str, np.ndarray] = {}
        if domain is not None:
            self._entry(domain)

    def domains(self) -> list[str]:
        return list(self.val)

    def _entry(self, domain: str | None) -> HoldoutEntry:
        domain = self.domain if domain is None else domain
        if domain is None:
            raise TokmixError(f"name a holdout domain: one of {', '.join(self.val)}")
        if domain not in self.val:
            raise TokmixError(f"no holdout {domain!r} in {self.root}; the run has {', '.join(self.val)}")
        return self.val[domain]

    def path(self, domain: str | None = None) -> Path:
        return self.root / self._entry(domain).file

    def _holdout(self, domain: str | None) -> np.ndarray:
        entry, path = self._entry(domain), self.path(domain)
        if path not in self._tokens:
            check_token_file(path, int(entry.tokens), self.dtype)
            windows, S = int(entry.eval_windows), self.seq_len
            if int(entry.eval_targets) != windows * S or windows * S + 1 > int(entry.tokens):
                raise TokmixError(
                    f"{path}: {windows:,} eval windows of {S} need {windows * S + 1:,} tokens and eval_targets = "
                    f"{windows * S:,}; the index records {entry.tokens:,} and {entry.eval_targets:,}"
                )
            self._tokens[path] = read_tokens(path, self.dtype)
        return self._tokens[path]

    def eval_windows(self, domain: str | None = None) -> int:
        return int(self._entry(domain).eval_windows)

    def eval_targets(self, domain: str | None = None) -> int:
        return int(self._entry(domain).eval_targets)

    def eval_bytes(self, domain: str | None = None) -> int:
        return int(self._entry(domain).eval_bytes)

    def window(self, i: int, domain: str | None = None) -> np.ndarray:
        """Eval window i as stored: seq_len + 1 tokens of the shard dtype."""
        if not 0 <= i < self.eval_windows(domain):
            raise TokmixError(f"eval window {i} does not exist: the holdout has {self.eval_windows(domain):,}")
        S = self.seq_len
        return np.array(self._holdout(domain)[i * S : i * S + S + 1])

    def batches(
        self, batch_size: int, domain: str | None = None, rank: int = 0, world_size: int = 1
    ) -> Iterator[Batch]:
        """(x, y) int64 batches of up to batch_size windows, in window order; the last one may be smaller. With
        world_size > 1, rank r takes the contiguous windows [r*W//world_size, (r+1)*W//world_size): sum the
        ranks' losses before bits_per_byte."""
        if batch_size < 1:
            raise TokmixError(f"batch_size {batch_size} must be at least 1")
        if not 0 <= rank < world_size:
            raise TokmixError(f"rank {rank} is outside world_size {world_size}")
        tokens, S, W = self._holdout(domain), self.seq_len, self.eval_windows(domain)
        for first in range(rank * W // world_size, (rank + 1) * W // world_size, batch_size):
            n = min(batch_size, (rank + 1) * W // world_size - first)
            span = tokens[first * S : (first + n) * S + 1]
            yield span[:-1].reshape(n, S).astype(BATCH_DTYPE), span[1:].reshape(n, S).astype(BATCH_DTYPE)

    def bits_per_byte(self, sum_nll_nats: float, domain: str | None = None) -> float:
        """sum_nll_nats is the loss summed (not averaged) over all eval_targets targets of the domain's windows,
        in nats; from a mean per-token loss pass mean * eval_targets(domain)."""
        return bits_per_byte(sum_nll_nats, self.eval_bytes(domain))


# ---------------------------------------------------------------------- optional PyTorch glue
def _torch():
    try:
        import torch
    except ImportError:
        raise TokmixError("PyTorch is not installed; the numpy batches need no torch") from None
    return torch


def to_torch(batch: Batch, device: Any = None) -> tuple[Any, Any]:
    """A numpy (x, y) as torch tensors, without a copy on the CPU; pinned and sent asynchronously to a GPU."""
    torch = _torch()
    out = []
    for a in batch:
        t = torch.from_numpy(a)
        if device is not None and torch.device(device).type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        elif device is not None:
            t = t.to(device)
        out.append(t)
    return out[0], out[1]


def torch_batches(loader: TrainBlocks, device: Any = None) -> Iterator[tuple[Any, Any]]:
    """Iterate a TrainBlocks as torch tensors; skips, state_dict() and resume act on `loader` as usual."""
    _torch()  # fail at the call, not at the first batch
    return (to_torch(batch, device) for batch in loader)
