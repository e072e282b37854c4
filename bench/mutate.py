"""Mutation testing: one-line bugs planted in the code behind each documented guarantee, each run against the
tests meant to catch it. Prints a table: mutation, caught / SURVIVED / does not apply.

    .venv/bin/python bench/mutate.py [--only NAME-SUBSTRING ...] [--list] [--keep]

Each mutation is anchored on a short exact snippet of one file: it applies only where that snippet occurs exactly
once, so as the code changes a mutation stops applying (reported as such) instead of landing somewhere else. The
repository's tracked files are copied to a scratch directory (never a worktree in use); each mutation is
applied there, its tests run (one pytest process at a time: the machine is shared), and the file restored.
Tests import tokmix from the scratch copy (PYTHONPATH), and so do the stage processes they start.

caught: the selected tests failed (or hung past --timeout). SURVIVED: they all passed, so the bug would go
unnoticed (kill it with a test, or explain in docs/reliability.md why it is equivalent). does not apply: the
snippet is gone or ambiguous. A survivor list and the caught rate are printed at the end.
"""

# ruff: noqa: E501  (the mutation table: each snippet is kept whole on its line, to be searched for as it is)
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

V = "tests/test_validate.py"
FAULT_KILL = "tests/test_faults.py::test_kill_anywhere_then_resume_ends_identical"
PIPE = "tests/test_pipeline.py"
CONFORMANCE = "tests/test_conformance.py"
ORACLE = "tests/test_oracles.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    guarantee: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    equivalent: str = ""  # why no test can tell (kept in the table, not run, not counted)


def m(name: str, guarantee: str, file: str, old: str, new: str, *tests: str, equivalent: str = "") -> Mutation:
    return Mutation(name, guarantee, file, old, new, tuple(dict.fromkeys(tests)), equivalent)


SHARDS, TOKENS, VALIDATE, STORE = "tokmix/shards.py", "tokmix/tokens.py", "tokmix/stages/validate.py", "tokmix/store.py"
OWNERSHIP = "tokmix/ownership.py"
ASSEMBLE, STREAMS, HOLDOUT = "tokmix/stages/assemble.py", "tokmix/stages/streams.py", "tokmix/stages/holdout.py"
INTERLEAVE, LOCK = "tokmix/interleave.py", "tokmix/lock.py"
RECIPE, DATA, SOURCES = "tokmix/recipe.py", "tokmix/data.py", "tokmix/sources/units.py"
IDENTITY = "tokmix/identity.py"
NGRAMS, DECONTAM_STAGE = "tokmix/ngrams.py", "tokmix/stages/decontam.py"
DECONTAM, DECONTAM_CACHE = "tests/test_decontam.py", "tests/test_decontam_cache.py"

MUTATIONS = [
    # ------------------------------------------------------------------ atomic commit
    m("write_bytes writes the final name directly", "atomic commit", STORE,
      '            with open(tmp, "wb") as f:\n                write_in_halves(f, data)\n            commit(tmp, path, durable)',
      '            with open(path, "wb") as f:\n                write_in_halves(f, data)\n            pass',
      f"{FAULT_KILL}[mid-write]", f"{FAULT_KILL}[mid-write]", f"{FAULT_KILL}[mid-write]"),
    m("token files written under their final name", "atomic commit", STORE,
      "        tmp = tmp_name(path)\n        return Pending(path, open(tmp, \"wb\"), tmp)\n",
      '        tmp = path if path.suffix in (".tok", ".len") else tmp_name(path)\n        return Pending(path, open(tmp, "wb"), tmp)\n',
      f"{FAULT_KILL}[first-hits]", f"{FAULT_KILL}[first-hits]"),
    m("a token file is renamed before its last bytes", "atomic commit", STORE,
      "        self.f.close()\n        if before_commit:\n            before_commit()\n        publish(self.tmp, self.path)",
      "        publish(self.tmp, self.path)\n        self.f.close()\n        if before_commit:\n            before_commit()",
      f"{FAULT_KILL}[first-hits]", f"{FAULT_KILL}[first-hits]",
      equivalent="every byte is written (and flushed after each write) before the rename either way: only a power "
                 "loss, not a kill, can see the order"),
    m("temporary files are not swept on resume", "atomic commit", OWNERSHIP,
      "self._own_tmp(folder, tmp, recorded) and tmp.is_file() and not tmp.is_symlink():\n                    tmp.unlink()",
      "self._own_tmp(folder, tmp, recorded) and tmp.is_file() and not tmp.is_symlink():\n                    pass",
      f"{FAULT_KILL}[first-hits]", f"{FAULT_KILL}[mid-write]"),
    m("a unit's record is written before its token file", "atomic commit", STREAMS,
      '    tokens_sha256 = writer.close(before_commit=lambda: fault_point("streams:unit-before-rename"))',
      '    write_json(unit_dir / f"{unit.name}.json", {"index": unit.index, "name": unit.name, "pieces": '
      'unit.describe(), "tokens": writer.tokens, "docs": kept, "chars": chars[0], "size": unit.size, '
      '"file_bytes": unit.file_bytes(), "limit": task.limit, "dropped_at": dropped_at, "encode_seconds": 0})\n'
      '    tokens_sha256 = writer.close(before_commit=lambda: fault_point("streams:unit-before-rename"))',
      f"{FAULT_KILL}[first-hits]", f"{FAULT_KILL}[later-hits-2]",
      equivalent="a record counts only with its .tok and .len beside it (streams._committed, itself mutated above)"),
    m("a unit counts as committed without its .len", "atomic commit", "tokmix/unit_files.py",
      'record.get(f"{kind}_sha256")) for kind in (TOKENS, LENGTHS, PLACES)',
      'record.get(f"{kind}_sha256")) for kind in (TOKENS, PLACES)',
      f"{FAULT_KILL}[first-hits]", "tests/test_oracles.py::test_a_unit_without_its_lengths_file_is_redone"),
    m("a shard on disk counts as done whatever its size", "atomic commit", ASSEMBLE,
      "    if not (shard.exists() and shard.stat().st_size == n_tokens * ctx.dtype.itemsize):",
      "    if not shard.exists():",
      "tests/test_oracles.py::test_a_shard_of_the_wrong_size_is_rewritten",
      equivalent="the shard's bytes are then checked against its record's checksum, which a shard of another size "
                 "fails: the size check only saves reading it"),
    m("a shard's record is written before the shard", "atomic commit", ASSEMBLE,
      '            records[k] = record\n            fault_point("assemble:after-rename")',
      '            records[k] = record\n            write_json(_record_path(ctx, k), records[k])\n'
      '            fault_point("assemble:after-rename")',
      f"{FAULT_KILL}[first-hits]",
      equivalent="the shard is committed inside write_shard before its result reaches this loop: the order is unchanged"),
    # ------------------------------------------------------------------ checksums
    m("the shard checksum hashes nothing", "checksums", TOKENS,
      "        if self.hash is not None:\n            self.hash.update(data)",
      "        if self.hash is not None:\n            pass",
      f"{V}::test_the_untouched_copy_is_valid", "tests/test_pipeline.py::test_index_matches_the_files"),
    m("the holdout checksum is of other bytes", "checksums", HOLDOUT,
      '"checksum": hashlib.new(CHECKSUM, tokens.tobytes()).hexdigest(),',
      '"checksum": hashlib.new(CHECKSUM, tokens[1:].tobytes()).hexdigest(),',
      f"{V}::test_the_untouched_copy_is_valid"),
    m("file_checksum reads only the first chunk", "checksums", SHARDS,
      "        while n := f.readinto(buffer):\n            h.update(buffer[:n])\n    return h.hexdigest()",
      "        n = f.readinto(buffer)\n        h.update(buffer[:n])\n    return h.hexdigest()",
      "tests/test_oracles.py::test_file_checksum_is_sha256_of_the_whole_file"),
    m("fingerprints weight every token alike", "checksums", TOKENS,
      "return ((np.arange(seq_len, dtype=np.uint32) * 2 + 1) * np.uint32(0x9E3779B1)) | np.uint32(1)",
      "return np.ones(seq_len, dtype=np.uint32)",
      f"{V}::test_a_flipped_shard_byte_names_its_block", f"{V}::test_two_swapped_tokens_name_their_block"),
    # ------------------------------------------------------------------ validate, check by check
    m("validate: a missing shard is not named", "validate", VALIDATE,
      'problems.append(f"{name}: missing")', "pass", f"{V}::test_a_missing_shard"),
    m("validate: partial tokens accepted", "validate", VALIDATE,
      "if path.stat().st_size % dtype.itemsize:", "if False:", f"{V}::test_a_shard_that_is_not_whole_tokens"),
    m("validate: the shard token count unchecked", "validate", VALIDATE,
      'if got["tokens"] != want or shard.tokens != want:', 'if shard.tokens != want:',
      f"{V}::test_a_truncated_shard_is_named_by_its_count_and_its_checksum"),
    m("validate: the index's token count unchecked", "validate", VALIDATE,
      'if got["tokens"] != want or shard.tokens != want:', 'if got["tokens"] != want:',
      f"{V}::test_a_shard_token_count_in_the_index"),
    m("validate: an id equal to the vocabulary accepted", "validate", VALIDATE,
      '        if vocab is not None and got["max"] >= vocab:\n            problems.append(f"{name}:',
      '        if vocab is not None and got["max"] > vocab:\n            problems.append(f"{name}:',
      f"{V}::test_an_id_equal_to_the_vocabulary_size_in_a_shard"),
    m("validate: the last id in range refused", "validate", VALIDATE,
      '        if vocab is not None and got["max"] >= vocab:\n            problems.append(f"{name}:',
      '        if vocab is not None and got["max"] >= vocab - 1:\n            problems.append(f"{name}:',
      f"{V}::test_the_largest_id_is_in_range"),
    m("validate: the shard checksum unchecked", "validate", VALIDATE,
      'if shard.checksum is not None and got["checksum"] != shard.checksum:', "if False:",
      f"{V}::test_a_flipped_shard_byte_names_its_block"),
    m("validate: the first delimiter unchecked", "validate", VALIDATE,
      "        if k == 0:\n            problems += _starts_a_document(name",
      "        if False:\n            problems += _starts_a_document(name", f"{V}::test_the_first_delimiter_of_the_first_shard"),
    m("validate: the overlap token unchecked", "validate", VALIDATE,
      'if previous_last is not None and got["first"] != previous_last:', "if False:",
      f"{V}::test_the_overlap_token_between_shards"),
    m("validate: the overlap compared with the wrong token", "validate", VALIDATE,
      '        previous_last = got["last"]\n', '        previous_last = got["first"]\n',
      f"{V}::test_the_untouched_copy_is_valid"),
    m("validate: per-shard stream counts unchecked", "validate", VALIDATE,
      "if counted != want - (k > 0):", "if False:", f"{V}::test_a_per_stream_token_count_of_a_shard"),
    m("validate: shard 0's first token not counted", "validate", VALIDATE,
      "if counted != want - (k > 0):", "if counted != want - 1:", f"{V}::test_the_untouched_copy_is_valid"),
    m("validate: a missing holdout not named", "validate", VALIDATE,
      'problems.append(f"{entry.file}: missing (holdout {domain})")', "pass", f"{V}::test_a_missing_holdout"),
    m("validate: the holdout token count unchecked", "validate", VALIDATE,
      'if got["tokens"] != entry.tokens:', "if False:", f"{V}::test_a_holdout_token_count"),
    m("validate: holdout ids unchecked", "validate", VALIDATE,
      '        if vocab is not None and got["max"] >= vocab:\n            problems.append(f"{entry',
      '        if False:\n            problems.append(f"{entry',
      f"{V}::test_an_id_equal_to_the_vocabulary_size_in_a_holdout"),
    m("validate: the holdout checksum unchecked", "validate", VALIDATE,
      'if entry.checksum is not None and got["checksum"] != entry.checksum:', "if False:", f"{V}::test_a_holdout_byte"),
    m("validate: the holdout delimiter unchecked", "validate", VALIDATE,
      '        problems += _starts_a_document(entry.file, got["first"], index)\n', "        problems += []\n",
      f"{V}::test_the_first_delimiter_of_a_holdout"),
    m("validate: total per-stream counts unchecked", "validate", VALIDATE,
      'if total is not None and total.has("tokens_by_stream") and by_stream != total.tokens_by_stream:', "if False:",
      f"{V}::test_the_total_per_stream_count"),
    m("validate: the block total unchecked", "validate", VALIDATE,
      'if sum(by_stream.values()) != run_tokens:', "if False:",
      f"{V}::test_the_total_block_count"),
    m("validate: the index's vocabulary ignored", "validate", VALIDATE,
      'vocab = vocab_size or index.vocab_size', "vocab = vocab_size",
      f"{V}::test_an_id_equal_to_the_vocabulary_size_in_a_shard"),
    m("validate: an index without shards passes", "validate", VALIDATE,
      '    if index is None or not index.shards:\n        return [', '    if False:\n        return [',
      f"{V}::test_an_index_without_shards"),
    m("validate: the share warning never fires", "validate", VALIDATE,
      "abs(realized[n] - t) > SHARE_WARNING]", "abs(realized[n] - t) > 1]",
      f"{V}::test_a_share_off_its_target_is_a_warning_not_a_failure"),
    m("the run ignores validate's problems", "validate", "tokmix/pipeline.py",
      "    problems = validate_dir(ctx.layout.root, index_path=ctx.layout.index, expected_path=ctx.layout.expected)\n",
      "    problems = validate_dir(ctx.layout.root, index_path=ctx.layout.index, expected_path=ctx.layout.expected)[:0]\n",
      "tests/test_oracles.py::test_a_run_that_fails_validation_says_so"),
    # ------------------------------------------------------------------ decontamination
    m("the last document of each holdout batch is not hashed", "decontamination", HOLDOUT,
      "            hashes.append(text_hashes(batch))", "            hashes.append(text_hashes(batch[:-1]))",
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    m("the holdout document that crosses the budget is not hashed", "decontamination", HOLDOUT,
      "                batch = batch[: k + 1]\n", "                batch = batch[:k]\n",
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    m("hashes cover a normalised text", "decontamination", SOURCES,
      'digests = b"".join(hashlib.blake2b(t.utf8() if isinstance(t, HugeText) else t.encode("utf-8"),',
      'digests = b"".join(hashlib.blake2b(t.utf8() if isinstance(t, HugeText) else t.strip().encode("utf-8"),',
      "tests/test_oracles.py::test_copies_are_exact_texts_not_normalised"),
    m("only texts of a holdout length hashed, off by one", "decontamination", STREAMS,
      "candidates = np.flatnonzero((chars < 0) | np.isin(chars, lengths))",
      "candidates = np.flatnonzero((chars < 0) | np.isin(chars + 1, lengths))",
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    m("a huge text is never hashed", "decontamination", STREAMS,
      "(chars < 0) | np.isin(chars, lengths)", "np.isin(chars, lengths)",
      "tests/test_pipeline.py::test_only_texts_of_a_holdout_length_are_hashed_and_copies_are_found"),
    m("copies are kept", "decontamination", STREAMS,
      "                    batch = [t for t, c in zip(batch, is_copy.tolist()) if not c]",
      "                    batch = list(batch)",
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    m("only the first domain's hashes are used", "decontamination", HOLDOUT,
      "_union([path_of(ctx, d) for d in ctx.recipe.domains], dtype)",
      "_union([path_of(ctx, d) for d in ctx.recipe.domains[:1]], dtype)",
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    m("a copy after the stream's last document is counted", "decontamination", STREAMS,
      'sum(1 for k in last["dropped_at"] if k < last_docs)', 'sum(1 for k in last["dropped_at"] if k <= last_docs)',
      "tests/test_oracles.py::test_every_planted_holdout_document_is_dropped"),
    # ------------------------------------------------------------------ benchmark decontamination (issue 29)
    m("a chain of exactly n words is let through by no first pass", "benchmark decontam", NGRAMS,
      "    good = words >= shortest\n", "    good = words > shortest\n",
      f"{DECONTAM}::test_every_document_the_oracle_drops_in_process", f"{DECONTAM}::test_recall_and_precision_against_the_oracle"),
    m("a piece ends one run before its chain does", "benchmark decontam", NGRAMS,
      "starts[heads] - offsets[owners], ends[lasts] - offsets[owners])",
      "starts[heads] - offsets[owners], ends[np.maximum(lasts - 1, heads)] - offsets[owners])",
      f"{DECONTAM}::test_long_documents_are_checked_in_the_pieces_that_may_hold_an_item"),
    m("a capital sigma's piece is checked alone", "benchmark decontam", NGRAMS,
      "            found[t] = None  # a capital sigma", "            found[t] = pieces  # a capital sigma",
      f"{DECONTAM}::test_a_final_sigma_whose_context_is_outside_its_piece"),
    m("a separator before a non-ASCII character never composes", "benchmark decontam", NGRAMS,
      "        letter[high - 1] = True  # a separator", "        letter[high - 1] |= False  # a separator",
      f"{DECONTAM}::test_every_document_the_oracle_drops_in_process"),
    m("a triple through a wild run may be refused (its last one)", "benchmark decontam", NGRAMS,
      "        for back in range(3):", "        for back in range(2):",
      f"{DECONTAM}::test_every_document_the_oracle_drops_in_process"),
    m("a refused triple cuts the chain one link late", "benchmark decontam", NGRAMS,
      "        new[1:] |= ~triple[ones[:-1]]", "        new[1:] |= ~triple[ones[1:]]",
      f"{DECONTAM}::test_every_document_the_oracle_drops_in_process"),
    m("a set with an item of two words takes its pairs from the triples", "benchmark decontam", DECONTAM_STAGE,
      "self.lengths[0] >= 3", "self.lengths[0] >= 2", f"{DECONTAM}::test_short_items_with_the_triple_filter"),
    m("min_matches counts one n-gram more", "benchmark decontam", DECONTAM_STAGE,
      "np.flatnonzero(counts >= self.min_matches)", "np.flatnonzero(counts + 1 >= self.min_matches)",
      f"{DECONTAM}::test_min_matches_counts_the_distinct_ngrams_of_each_item"),
    m("one n-gram is enough whatever min_matches", "benchmark decontam", DECONTAM_STAGE,
      "return items.tolist() if self.min_matches == 1 else []", "return items.tolist()",
      f"{DECONTAM}::test_min_matches_counts_the_distinct_ngrams_of_each_item"),
    m("action report drops too", "benchmark decontam", STREAMS,
      'self.ctx.recipe.decontaminate.action == "drop"', 'self.ctx.recipe.decontaminate.action != ""',
      f"{DECONTAM}::test_action_report_lists_what_drop_would_and_keeps_it"),
    m("a built set taken from the cache is not checked", "benchmark decontam", "tokmix/cache.py",
      "                    if _place(self.entry_dir(key) / file, dst) != sha256:",
      "                    if _place(self.entry_dir(key) / file, dst) != sha256 and False:",
      f"{DECONTAM_CACHE}::test_a_damaged_entry_is_said_and_built_again"),
    m("the set cache's key leaves out the fields", "benchmark decontam", DECONTAM_STAGE,
      '"fields": bench.fields, "id_field": bench.id_field}', '"id_field": bench.id_field}',
      DECONTAM_CACHE),
    # ------------------------------------------------------------------ tokenizer backends (issue 27)
    m("Digits(individual_digits) read as runs of digits", "backends", "tokmix/backends.py",
      'number = r"\\p{N}" if digits.get("individual_digits") else r"\\p{N}+"',
      'number = r"\\p{N}+"',
      "tests/test_backends_digits.py",
      equivalent="a BPE trained with individual digits has no merge of two digits, so a run of them encodes to the "
                 "same ids as its digits one by one; a vocabulary that had such merges is judged by the oracle check"),
    # ------------------------------------------------------------------ provenance places (streams)
    m("a parquet batch's empty documents get places", "provenance", "tokmix/sources/parquet.py",
      "empty=np.diff(offsets) == 0)", "empty=None)",
      "tests/test_provenance.py"),
    m("places taken are trimmed one too few", "provenance", "tokmix/sources/pieces.py",
      "                del values[:b]\n", "                del values[:b - 1]\n",
      "tests/test_provenance.py::test_a_units_places_are_taken_in_order_past_the_trim_of_what_was_taken"),
    # ------------------------------------------------------------------ the interleave
    m("the interleave seed is off by one", "interleave", INTERLEAVE,
      "np.random.default_rng(seed).shuffle(order)", "np.random.default_rng(seed + 1).shuffle(order)",
      "tests/test_oracles.py::test_the_train_stream_is_the_seeded_interleave_of_the_streams"),
    m("the interleave is not shuffled", "interleave", INTERLEAVE,
      "np.random.default_rng(seed).shuffle(order)", "np.random.default_rng(seed)",
      "tests/test_oracles.py::test_the_train_stream_is_the_seeded_interleave_of_the_streams"),
    m("the shard's first document skip is ignored", "interleave", ASSEMBLE,
      "            took[0] -= skip\n", "",
      "tests/test_oracles.py::test_the_train_stream_is_the_seeded_interleave_of_the_streams", "tests/test_assemble.py"),
    m("the shard ends one token early", "interleave", ASSEMBLE,
      "            took[-1] -= max(int(ends[last]) - left, 0)", "            took[-1] -= max(int(ends[last]) - left, 0) + 1",
      "tests/test_assemble.py"),
    m("offsets within a unit shifted", "interleave", ASSEMBLE,
      "return Cursor(u, docs - before_docs, tokens - before_tokens)",
      "return Cursor(u, docs - before_docs, tokens - before_tokens + 1)",
      "tests/test_oracles.py::test_the_train_stream_is_the_seeded_interleave_of_the_streams"),
    m("runs merged across streams", "interleave", ASSEMBLE,
      "new_run[1:] = chunk[1:] != chunk[:-1]", "new_run[1:] = False",
      "tests/test_assemble.py"),
    m("the overlap token counted in both shards", "interleave", ASSEMBLE,
      "    if task.drop_first:\n        by_stream[first_stream] -= 1\n", "", f"{V}::test_the_untouched_copy_is_valid"),
    m("documents_used counts one document more", "interleave", ASSEMBLE,
      "used = [d + (s == end.stream) for s, d in enumerate(end.docs_before)]",
      "used = [d + 1 for s, d in enumerate(end.docs_before)]",
      "tests/test_assemble.py::test_documents_used_are_those_with_a_token_in_the_run"),
    # ------------------------------------------------------------------ budgets and shares
    m("budgets without the slack", "budgets", RECIPE,
      "int(self.streams[stream].share * self.train_tokens * self.layout.stream_slack) + 1",
      "int(self.streams[stream].share * self.train_tokens) + 1",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("budgets one token short", "budgets", RECIPE,
      "int(self.streams[stream].share * self.train_tokens * self.layout.stream_slack) + 1",
      "int(self.streams[stream].share * self.train_tokens * self.layout.stream_slack)",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("train tokens without the last block's extra token", "budgets", RECIPE,
      "        return tokens_in_shard(self.blocks, self.layout.seq_len)\n",
      "        return tokens_in_shard(self.blocks, self.layout.seq_len) - 1\n",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("a stream stops before the crossing document", "budgets", STREAMS,
      "    last_docs = int(np.searchsorted(cum, budget - before)) + 1\n",
      "    last_docs = int(np.searchsorted(cum, budget - before))\n",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("a limited unit keeps a document too many", "budgets", STREAMS,
      "keep = int(np.searchsorted(np.cumsum(lens), task.limit - writer.tokens)) + 1",
      "keep = int(np.searchsorted(np.cumsum(lens), task.limit - writer.tokens)) + 2",
      "tests/test_pipeline.py::test_a_unit_with_a_limit_is_the_prefix_of_the_whole_unit_up_to_the_document_that_reaches_it"),
    m("the limit given is the whole budget", "budgets", STREAMS,
      "limit = self.budget - self.prefix_tokens if ready else None", "limit = self.budget if ready else None",
      "tests/test_pipeline.py::test_a_limited_unit_is_the_one_that_reaches_the_budget_and_ends_there"),
    m("the committed prefix stops one unit early", "budgets", STREAMS,
      "        return self.prefix_tokens >= self.budget\n", "        return self.prefix_tokens + 1 >= self.budget\n",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("shards split at the wrong block count", "budgets", RECIPE,
      "        return self.layout.shard_tokens // self.layout.seq_len\n",
      "        return self.layout.shard_tokens // self.layout.seq_len - 1\n",
      "tests/test_oracles.py::test_the_train_stream_is_the_seeded_interleave_of_the_streams"),
    m("holdout shares within a domain ignored", "budgets", HOLDOUT,
      "need * recipe.share(name) / total_share for name in names}", "need / len(names) for name in names}",
      "tests/test_oracles.py::test_each_holdout_is_the_seeded_shuffle_of_its_streams_documents"),
    m("the holdout shuffle seed ignored", "budgets", HOLDOUT,
      "    random.Random(seed).shuffle(docs)\n", "    random.Random(0).shuffle(docs)\n",
      "tests/test_oracles.py::test_each_holdout_is_the_seeded_shuffle_of_its_streams_documents"),
    # ------------------------------------------------------------------ EOT placement
    m("EOT after each document, not before", "EOT placement", TOKENS,
      "            out[starts + j] = token\n        for j, token in enumerate(self.suffix):",
      "            out[starts + lengths + j] = token\n        for j, token in enumerate(self.suffix):",
      "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget", f"{V}::test_the_untouched_copy_is_valid"),
    m("EOT written as id 1", "EOT placement", TOKENS,
      "            out[starts + j] = token\n", "            out[starts + j] = 1\n", f"{V}::test_the_untouched_copy_is_valid"),
    m("empty texts kept as lone EOTs", "EOT placement", SOURCES,
      "        if not text:\n            continue\n        if not batch and", "        if not batch and", "tests/test_oracles.py::test_each_stream_ends_at_the_document_that_crosses_its_budget"),
    m("a huge document's EOT left out", "EOT placement", STREAMS,
      "    writer.write(np.array(delimiters.prefix, dtype=writer.dtype))\n", "",
      "tests/test_huge_documents.py"),
    # ------------------------------------------------------------------ the loader's block index
    m("locate picks the shard before", "loader", DATA,
      'k = int(np.searchsorted(self.first_block, j, side="right")) - 1',
      'k = int(np.searchsorted(self.first_block, j, side="left")) - 1', "tests/test_data.py"),
    m("a block spans seq_len tokens, not seq_len + 1", "loader", DATA,
      "return np.array(self._span(k, start, shards.block_tokens(self.shard_seq_len[k])))",
      "return np.array(self._span(k, start, shards.block_tokens(self.shard_seq_len[k]) - 1))", "tests/test_data.py"),
    m("ranks take interleaved, not contiguous, blocks", "loader", DATA,
      "        return rank * per_rank, per_rank\n", "        return rank, per_rank\n", "tests/test_data.py"),
    m("skip does not move the data", "loader", DATA,
      "        physical = step + self.skipped\n", "        physical = step\n", "tests/test_data.py"),
    m("the margin can be overrun", "loader", DATA,
      "        elif self.skipped + n_steps > self.margin_steps:", "        elif self.skipped + n_steps > self.margin_steps + 1:",
      "tests/test_data.py"),
    m("a resumed loader repeats a step", "loader", DATA,
      "            batch = self.batch(self.step)\n            self.step += 1\n            yield batch",
      "            batch = self.batch(self.step)\n            yield batch\n            self.step += 1", "tests/test_data.py"),
    # ------------------------------------------------------------------ the lock
    m("another host's lock is taken over unasked", "lock", LOCK,
      "holder[0] != socket.gethostname() and not self.break_lock:", "holder[0] != socket.gethostname() and False:",
      "tests/test_trust.py::test_a_lock_taken_on_another_host_is_broken_only_when_the_user_says_so"),
    m("a stale lock is never taken over", "lock", LOCK,
      "        return holder if len(holder) == 2 and holder[1].isdigit() else []\n",
      "        if len(holder) == 2:\n            raise TokmixError('locked')\n        return []\n",
      "tests/test_faults.py::test_a_second_run_on_the_same_directory_is_refused_and_a_stale_lock_taken_over"),
    m("the lock is not exclusive", "lock", LOCK,
      "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        except BlockingIOError:\n            pids = read_holder",
      "            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n        except BlockingIOError:\n            pids = read_holder",
      "tests/test_faults.py::test_a_second_run_on_the_same_directory_is_refused_and_a_stale_lock_taken_over",
      "tests/test_trust.py::test_of_many_runs_started_together_over_a_stale_lock_one_writes"),
    m("an earlier run's live worker is not waited for", "lock", LOCK,
      "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except BlockingIOError:\n        pids = flock_holders",
      "        pass\n    except BlockingIOError:\n        pids = flock_holders",
      "tests/test_trust.py::test_a_worker_process_left_writing_by_a_killed_stage_process_keeps_a_new_run_out"),
    # ------------------------------------------------------------------ resume identity
    m("a changed recipe resumes", "resume identity", IDENTITY,
      '("output_fields",), changes=recipe_diff,\n        refusal=_recipe_refusal, shape=',
      '("output_fields",), changes=lambda old, new: [],\n        refusal=_recipe_refusal, shape=',
      "tests/test_pipeline.py::test_resuming_with_a_changed_recipe_is_refused_with_a_diff"),
    m("the seed left out of the run's identity", "resume identity", RECIPE,
      "        data[\"layout\"][\"blocks\"] = self.blocks\n",
      "        data[\"layout\"][\"blocks\"] = self.blocks\n        data.pop(\"seed\")\n",
      "tests/test_pipeline.py::test_resuming_with_a_changed_recipe_is_refused_with_a_diff"),
    m("a resized source file resumes", "resume identity", STREAMS,
      "               if was != piece.file_bytes]", "               if False]",
      "tests/test_faults.py::test_a_jsonl_file_that_changed_length_is_refused_where_its_committed_ranges_still_match"),
    m("a re-cut source file resumes", "resume identity", STREAMS,
      '    cut = record["pieces"] == unit.describe()\n', "    cut = True\n",
      "tests/test_faults.py::test_a_changed_file_among_grouped_small_files_is_named_with_its_unit"),
    m("a resume re-cuts units with today's unit size", "resume identity", IDENTITY,
      '("unit_bytes",), on_change="keep"', '("unit_bytes",), on_change="redo"',
      "tests/test_oracles.py::test_a_resume_keeps_the_unit_size_the_run_started_with"),
]


def scratch_tree(dest: Path) -> Path:
    """The repository's tracked files (as they are in the working tree) under dest/tree, and dest/shared pointing at
    the reference script's directory, where test_conformance looks for it."""
    tree = dest / "tree"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    for parent in REPO.parents:
        if (parent / "shared" / "reference").is_dir():
            (dest / "shared").symlink_to(parent / "shared")
            break
    return tree


def run_tests(tree: Path, selection: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """'passed', 'failed', 'timeout' or 'error: ...' (no test ran: a selection that names nothing), the seconds
    and the end of pytest's output. One pytest process for the whole selection, so module fixtures (a corpus, a
    clean run) are built once."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("CI", None)
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *selection]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    seconds = time.perf_counter() - t0
    if proc.returncode in (0, 1, 2):  # 2: a collection error, e.g. the mutated module does not import
        return ("passed", "failed", "failed")[proc.returncode], seconds, proc.stdout[-3000:]
    # 4: a selected test does not exist (renamed?), 5: nothing collected
    return f"error (pytest exit {proc.returncode}: {proc.stdout.strip()[-200:]})", seconds, proc.stdout[-3000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="run the mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations and whether each applies")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a mutation's tests may take")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the selected tests unmutated first")
    args = parser.parse_args()
    chosen = [mu for mu in MUTATIONS if not args.only or any(o in mu.name for o in args.only)]
    scratch = Path(tempfile.mkdtemp(prefix="tokmix-mutate-"))
    try:
        tree = scratch_tree(scratch)
        if not args.list and not args.no_baseline:  # a test failing without any mutation would catch them all
            selected = sorted({t for mu in chosen for t in mu.tests})
            outcome, seconds, tail = run_tests(tree, tuple(selected), args.timeout * 3)
            print(f"baseline: the {len(selected)} selections unmutated: {outcome} in {seconds:.0f}s", flush=True)
            if outcome != "passed":
                print(tail)
                sys.exit("the tests fail without a mutation: fix them first")
        rows = []
        for n, mu in enumerate(chosen, 1):
            path = tree / mu.file
            original = path.read_text() if path.exists() else ""
            count = original.count(mu.old) if mu.old else 0
            if mu.equivalent:
                result, seconds = "equivalent", 0.0
            elif count != 1:
                result, seconds = "does not apply" + (f" ({count} matches)" if count else ""), 0.0
            elif args.list:
                result, seconds = "applies", 0.0
            else:
                path.write_text(original.replace(mu.old, mu.new))
                try:
                    outcome, seconds, _ = run_tests(tree, mu.tests, args.timeout)
                finally:
                    path.write_text(original)
                result = {"failed": "caught", "timeout": "caught (tests hung)", "passed": "SURVIVED"}.get(outcome,
                                                                                                         outcome)
            rows.append((mu, result))
            print(f"{n:3d}  {result:16s} {seconds:6.1f}s  [{mu.guarantee}] {mu.name}  ({mu.file})", flush=True)
    finally:
        if args.keep:
            print(f"scratch directory kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    applied = [(mu, r) for mu, r in rows if not r.startswith(("does not apply", "error", "applies", "equivalent"))]
    caught = [mu for mu, r in applied if r.startswith("caught")]
    print()
    print(f"{'mutation':62s} {'guarantee':16s} result")
    for mu, r in rows:
        print(f"{mu.name[:62]:62s} {mu.guarantee:16s} {r}")
    print()
    print(f"{len(rows)} mutations, {len(applied)} applied and tested, {len(caught)} caught "
          f"({100 * len(caught) / max(len(applied), 1):.1f}%), {len(applied) - len(caught)} survived, "
          f"{sum(r.startswith('does not apply') for _, r in rows)} do not apply, "
          f"{sum(r.startswith('error') for _, r in rows)} errors, {sum(r == 'equivalent' for _, r in rows)} equivalent "
          "(not run: see each one's reason in bench/mutate.py)")
    for mu, r in applied:
        if r == "SURVIVED":
            print(f"  survivor: {mu.name} ({mu.file})")


if __name__ == "__main__":
    main()
