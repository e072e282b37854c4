"""Exports read back by readers written here from the formats' public descriptions (and by megatron-core's
own IndexedDataset where it is installed): Megatron gives back the run's documents, llm.c its tokens."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.test_data import EVAL_WINDOWS, SEQ_LEN, SHARD_BLOCKS, build_run
from tokmix.errors import TokmixError
from tokmix.export import export, export_llmc, export_megatron


@pytest.fixture(params=["uint16", "uint32"])
def run(request, tmp_path):
    return build_run(tmp_path / "out", request.param)


def documents(tokens: np.ndarray) -> list[np.ndarray]:
    """A token stream cut before each EOT: every document keeps its leading EOT."""
    return np.split(tokens, np.flatnonzero(tokens == 0)[1:])


def read_megatron(prefix: Path) -> tuple[int, np.ndarray, list[np.ndarray]]:
    """Megatron's MMIDIDX layout: magic, <Q version, <B dtype code, <Q sequences, <Q document-index entries,
    then int32 lengths, int64 byte pointers, int64 document indices. Returns (dtype code, document indices,
    sequences)."""
    idx = Path(f"{prefix}.idx").read_bytes()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", idx, 9)
    (code,) = struct.unpack_from("<B", idx, 17)
    sequences, doc_entries = struct.unpack_from("<QQ", idx, 18)
    assert version == 1
    offset = 34
    lengths = np.frombuffer(idx, "<i4", sequences, offset)
    offset += lengths.nbytes
    pointers = np.frombuffer(idx, "<i8", sequences, offset)
    offset += pointers.nbytes
    doc_index = np.frombuffer(idx, "<i8", doc_entries, offset)
    assert offset + doc_index.nbytes == len(idx)
    dtype = np.dtype({8: "<u2", 4: "<i4"}[code])
    data = Path(f"{prefix}.bin").read_bytes()
    assert pointers[0] == 0 and int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize == len(data)
    return code, doc_index, [np.frombuffer(data, dtype, n, p) for n, p in zip(lengths, pointers)]


def read_llmc(path: Path) -> tuple[int, int, np.ndarray]:
    """llm.c's token file: 256 int32 (magic, version, token count, zeros), then the tokens."""
    header = np.fromfile(path, "<i4", 256)
    assert not header[3:].any()
    dtype = np.dtype({20240520: "<u2", 20240801: "<u4"}[int(header[0])])
    tokens = np.fromfile(path, dtype, offset=256 * 4)
    assert len(tokens) == header[2]
    return int(header[0]), int(header[1]), tokens


@pytest.mark.parametrize("chunk_bytes", [4, 12, 1 << 26])
def test_megatron_gives_back_every_document_once(run, tmp_path, chunk_bytes):
    prefix = tmp_path / "mega" / "tokmix_text"
    written = export_megatron(run.root, prefix, chunk_bytes=chunk_bytes)
    assert {p.name for p in written} == {
        f"tokmix_text{s}.{e}" for s in ["", *(f"_val_{d}" for d in EVAL_WINDOWS)] for e in ("bin", "idx")
    }
    code, doc_index, docs = read_megatron(prefix)
    expected = documents(run.stream)
    assert code == 4  # ids up to 65,535 (no vocab_size recorded): int32, as Megatron's preprocess writes them
    assert len(docs) == len(expected) and np.array_equal(doc_index, np.arange(len(expected) + 1))
    assert all(np.array_equal(a, b) for a, b in zip(docs, expected))
    # the overlap tokens are not repeated: the .bin is the train stream token for token
    assert Path(f"{prefix}.bin").read_bytes() == run.stream.astype("<i4").tobytes()
    for domain, tokens in run.val.items():
        _, _, val_docs = read_megatron(tmp_path / "mega" / f"tokmix_text_val_{domain}")
        assert [d.tolist() for d in val_docs] == [d.tolist() for d in documents(tokens)]
    assert not list((tmp_path / "mega").glob("*tmp*"))


@pytest.mark.parametrize("vocab, code", [(50_257, 8), (65_499, 8), (65_500, 4), (65_536, 4), (128_256, 4)])
def test_megatron_token_dtype_follows_its_preprocess(tmp_path, vocab, code):
    """Megatron's preprocess (DType.optimal_dtype) writes uint16 for a vocabulary under 65,500 ids, int32 from
    there, whatever dtype the run's shards use."""
    run = build_run(tmp_path / "out", "uint16" if vocab <= 1 << 16 else "uint32")
    index = json.loads((run.root / "index.json").read_text())
    (run.root / "index.json").write_text(json.dumps({**index, "vocab_size": vocab}))
    export_megatron(run.root, tmp_path / "m")
    got, _, docs = read_megatron(tmp_path / "m")
    assert got == code
    dtype = "<u2" if code == 8 else "<i4"
    assert (tmp_path / "m.bin").read_bytes() == run.stream.astype(dtype).tobytes()


def test_megatron_core_reads_the_export(run, tmp_path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset", reason="megatron-core is not installed")
    prefix = tmp_path / "mega" / "train"
    export_megatron(run.root, prefix)
    dataset = indexed.IndexedDataset(str(prefix))
    expected = documents(run.stream)
    assert len(dataset) == len(expected)
    assert all(np.array_equal(dataset[i], doc) for i, doc in enumerate(expected))


def test_llmc_gives_back_every_token(run, tmp_path):
    out = tmp_path / "llmc"
    written = export_llmc(run.root, out)
    names = [f"tokmix_train_{k:03d}.bin" for k in range(len(SHARD_BLOCKS))]
    assert [p.name for p in written] == names + [f"tokmix_val_{d}.bin" for d in EVAL_WINDOWS]
    magic_version = (20240520, 1) if run.dtype == np.uint16 else (20240801, 7)
    first = 0
    for name, shard, blocks in zip(names, run.shard_files, SHARD_BLOCKS):
        magic, version, tokens = read_llmc(out / name)
        assert (magic, version) == magic_version
        assert tokens.tobytes() == shard.read_bytes()
        assert np.array_equal(tokens, run.stream[first * SEQ_LEN : (first + blocks) * SEQ_LEN + 1])
        first += blocks
    for domain, tokens in run.val.items():
        assert np.array_equal(read_llmc(out / f"tokmix_val_{domain}.bin")[2], tokens)


def test_export_dispatches_and_refuses_unknown_formats(run, tmp_path):
    written = export(run.root, "megatron", tmp_path / "m" / "data")
    assert (tmp_path / "m" / "data.idx") in written
    assert (tmp_path / "l" / "tokmix_train_000.bin") in export(run.root, "llmc", tmp_path / "l")
    with pytest.raises(TokmixError, match="unknown export format 'nemo'"):
        export(run.root, "nemo", tmp_path / "x")


def test_shards_that_do_not_chain_are_refused(run, tmp_path):
    shard = run.shard_files[1]
    tokens = np.fromfile(shard, run.dtype)
    tokens[0] = tokens[0] + 1
    tokens.tofile(shard)
    with pytest.raises(TokmixError, match="train_001.bin: first token .* the shards do not chain"):
        export_megatron(run.root, tmp_path / "m" / "data")
    assert not (tmp_path / "m" / "data.bin").exists()
    assert not list((tmp_path / "m").glob("*"))
