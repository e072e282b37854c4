"""Cases a user tries that the main tests of #27 (tokenizers as their authors define them) and #29 (benchmark
decontamination) do not: small or odd benchmark files, odd documents, odd recipes; each checked against what
docs/recipe.md promises, in-process where it can be (fast), with a real run where only a run shows it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_decontam import NGRAM, oracle_contaminated, oracle_grams, oracle_words, set_recipe


def built_set(root: Path, items: list, name: str = "bench", **keys):
    """A benchmark of `items` (JSONL rows; a str is {"text": it}) built as a run builds it, read as a worker."""
    from tokmix.stages.decontam import BenchmarkSet, build_set

    root.mkdir(exist_ok=True)
    path = root / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"text": i} if isinstance(i, str) else i) + "\n" for i in items))
    record = build_set(set_recipe(root, [path], ["text"], None, **keys), root / name, [])
    return record, BenchmarkSet(str(root / name))


def test_a_small_set_and_documents_without_any_of_its_pairs(tmp_path):
    """A set of a few items (one short: fewer than ngram words) and a batch of documents none of which holds two
    consecutive words of an item: the first pass finds no chain at all, and every document is kept."""
    items = ["def add(a, b): return a + b", " ".join(f"word{i}" for i in range(20))]
    _, bench = built_set(tmp_path, items)
    docs = ["hello world", "nothing here at all", "", "add"]
    grams = [oracle_grams(oracle_words(t), NGRAM) for t in items]
    assert bench.contaminating(docs) == [oracle_contaminated(t, grams, {6, NGRAM}) for t in docs] == [[]] * 4


def read_items(path: Path, fields: list[str], id_field: str | None = None) -> list | str:
    from tokmix.errors import TokmixError
    from tokmix.sources.benchmarks import iter_items

    try:
        return [(i.id, i.text) for i in iter_items("b", [str(path)], fields, id_field, [], {})]
    except TokmixError as e:
        return str(e)


def test_benchmark_jsonl_lines_are_read_as_a_streams_lines_are(tmp_path):
    """A benchmark's JSONL line is read as json.loads reads it, as a training file's are (docs/format.md): a
    byte-order mark, NaN in another field and a lone surrogate escape (made U+FFFD, as in the documents it is
    checked against) are read, not refused as "not JSON"; an id that is neither a string nor an integer (true,
    a list) is named with its line instead of becoming Python's spelling of it."""
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"q": "one two", "id": "a"}\n{"q": "caf\\ud800 three", "score": NaN, "id": 7}\n')
    assert read_items(path, ["q"], "id") == [("a", "one two"), ("7", "caf\ufffd three")]
    for value in ("true", "[1, 2]", '{"k": 1}', "1.5"):
        path.write_text(json.dumps({"q": "x", "id": "ok"}) + '\n{"q": "y", "id": ' + value + "}\n")
        assert read_items(path, ["q"], "id") == (f"benchmark b: file {path}: line 2: id field 'id' is a "
                                                 f"{type(json.loads(value)).__name__}, not a string or an integer")
    path.write_text('{"q": "x", "id": null}\n{"q": "y"}\n')
    assert read_items(path, ["q"], "id") == f"benchmark b: file {path}: line 1: id field 'id' is null"
    path.write_text('{"q": "y"}\n')
    assert read_items(path, ["q"], "id") == f"benchmark b: file {path}: line 1: id field 'id' is missing (it has q)"


def test_a_sentencepiece_model_with_user_defined_pieces_stays_on_sentencepiece(tmp_path):
    """sentencepiece takes a user-defined piece ("<tag>") whole wherever it occurs in a text; the tokenizer.json
    view fastokens reads has it as one more BPE piece, so fastokens splits it. A check whose texts hold no such
    piece (a run's first documents rarely do) cannot see that: auto keeps the model on sentencepiece, said in one
    line, and its ids are sentencepiece's on a document that holds one."""
    import io

    import sentencepiece

    from tests.test_decontam import humaneval
    from tokmix.backends import choose_backend, make_encoder

    texts = [p["prompt"] for p in humaneval()]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=400,
                                             model_type="bpe", normalization_rule_name="identity", byte_fallback=True,
                                             remove_extra_whitespaces=False, user_defined_symbols=["<tag>"],
                                             minloglevel=2)
    path = tmp_path / "user.model"
    path.write_bytes(model.getvalue())
    name, notices = choose_backend(path, "auto", texts[:20])
    assert (name, notices) == ("sentencepiece", ["fastokens: not applicable: it has user-defined pieces (<tag>), "
                                                 "which sentencepiece takes whole wherever they occur in a text — "
                                                 "falling back to sentencepiece"])
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    ids, _ = make_encoder(path, name).encode_batch(["a <tag> b"])
    assert ids.tolist() == sp.encode("a <tag> b") and sp.piece_to_id("<tag>") in ids.tolist()


def test_a_plain_text_benchmark_file_with_a_byte_order_mark(tmp_path):
    """A text file saved with a UTF-8 byte-order mark (as Windows editors save one): the mark is not part of its
    first item, whose first word would otherwise be "\\ufeffalpha" (U+FEFF joins words): a short item then never
    matched, a long one lost its first n-gram."""
    path = tmp_path / "items.txt"
    path.write_bytes(b"\xef\xbb\xbfalpha bravo charlie\r\nsecond item\r\n")
    assert read_items(path, ["text"]) == [("0", "alpha bravo charlie"), ("1", "second item")]
    path.write_bytes(b"\xef\xbb\xbfalpha\xff")
    assert read_items(path, ["text"]) == f"benchmark b: file {path}: line 1: byte 8 is not UTF-8 text"


def test_a_benchmark_file_that_is_a_fifo_is_named_not_opened(tmp_path):
    """A benchmark path naming a FIFO (or a device) is refused by its stat, as a source file's is: opening one for
    reading waits for a writer, forever. (Run in a thread: the code before this hung.)"""
    import os
    import threading

    path = tmp_path / "items.jsonl"
    os.mkfifo(path)
    said = []
    reader = threading.Thread(target=lambda: said.append(read_items(path, ["text"])), daemon=True)
    reader.start()
    reader.join(10)
    assert said == [f"benchmark b: file {path}: is a FIFO, not a regular file; tokmix reads only regular files"]


def test_fields_or_an_id_field_for_a_plain_text_benchmark_file_are_refused(tmp_path):
    """A plain-text file's items are its lines: fields and id_field, which it cannot have, are refused rather than
    silently not used (a JSONL file named .txt, or with no suffix, would be read as text, its keys words of every
    item)."""
    path = tmp_path / "HumanEval"
    path.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f(): pass"}) + "\n")
    refusal = (f"benchmark b: file {path}: read as plain text (one item a line), which has no fields: fields and "
               "id_field are for JSONL and parquet files (.jsonl, .jsonl.gz, .parquet, ...)")
    assert read_items(path, ["prompt"]) == read_items(path, ["text"], "task_id") == refusal
    assert read_items(path, ["text"]) == [("0", path.read_text().strip())]


def test_an_item_with_fewer_ngrams_than_min_matches_is_never_found(tmp_path):
    """min_matches counts distinct n-grams of one item: with 2, a short item (one n-gram, its whole) and an item
    of ngram words (one) are never found, even in a document that is exactly the item; one of ngram + 1 words is
    found only with both of its n-grams (docs/recipe.md)."""
    long = " ".join(f"w{i}" for i in range(NGRAM + 1))
    items = ["alpha bravo charlie", " ".join(long.split()[:NGRAM]), long]
    _, bench = built_set(tmp_path, items, min_matches=2)
    docs = [items[0], items[1], long, " ".join(long.split()[1:])]
    assert bench.contaminating(docs) == [[], [], [2], []]


def test_a_text_of_one_run_of_non_ascii_words_first_in_its_group(tmp_path):
    """A text whose words all start with non-ASCII letters (Cyrillic, Greek: each space before one joins its run)
    is one "wild" run for the first pass, linked to no other; it may hold an item whole. Such a run was kept by
    its number in the group instead of its words (so the group's first runs were dropped): a document first in
    its group, here alone, that is an item or holds a long one, was let through unchecked. The oracle's items."""
    from tokmix.ngrams import run_candidates

    short = "Привет мир снова"
    long = " ".join(f"слово{i}" for i in range(NGRAM + 2))
    items = [short, long, "zebra zulu yankee"]
    docs = [short, "Сегодня " + long + " конец", "ΑΒΓ " + short.upper(), "мир Привет снова"]
    grams = [oracle_grams(oracle_words(t), NGRAM) for t in items]
    expected = [oracle_contaminated(t, grams, {3, NGRAM}) for t in docs]
    assert expected == [[0], [1], [0], []]
    _, bench = built_set(tmp_path, items)
    for i, doc in enumerate(docs):  # each alone: the first (and only) text of its group
        kept = run_candidates([doc], bench.first_pass_pairs(), bench.member, bench.lengths[0])
        assert kept or not expected[i], doc  # the first pass lets every text that may hold an item through
        assert built_set(tmp_path / str(i), items)[1].contaminating([doc]) == [expected[i]]


def test_a_tiktoken_file_changed_under_a_resume_is_refused(tmp_path):
    """A run keeps its own copy of a .tiktoken file's ranks (tokenizer.tiktoken.json) and reads that: a resume
    finding the recipe's file changed (two ranks swapped) is refused as a changed tokenizer.json is, instead of
    going on with the first file's ids as if nothing had changed."""
    import pytest

    from tests.vocab import gpt2_tiktoken
    from tokmix.errors import TokmixError
    from tokmix.recipe import recipe_from_dict
    from tokmix.shards import Layout
    from tokmix.tokenizer_stage import same_tokenizer_source

    source = gpt2_tiktoken(tmp_path)
    recipe = recipe_from_dict({"seed": 1, "tokenizer": {"tiktoken": "gpt2.tiktoken"}, "layout": {"steps": 1,
                               "seqs_per_step": 1}, "holdout": {"tokens": 1, "eval_windows": 0},
                               "streams": {"a": {"domain": "a", "share": 1.0, "files": ["x"]}}}, tmp_path)
    layout = Layout(tmp_path / "out")
    layout.state.mkdir(parents=True)
    same_tokenizer_source(layout, recipe)
    same_tokenizer_source(layout, recipe)  # a resume: the same file
    lines = source.read_bytes().splitlines()
    (a, x), (b, y) = lines[300].split(), lines[301].split()
    lines[300:302] = [a + b" " + y, b + b" " + x]
    source.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TokmixError, match=f"tokenizer {source}: changed since this run started"):
        same_tokenizer_source(layout, recipe)


def test_plan_names_a_benchmark_that_can_take_nothing(tmp_path):
    """An empty benchmark file (a failed download), or one whose items hold no word, decontaminates against
    nothing: plan says so in a note naming it and its files; a benchmark with words gets no such note."""
    from tokmix.plan import _benchmarks

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "punct.jsonl").write_text(json.dumps({"text": "!!! ... ???"}) + "\n")
    (tmp_path / "words.jsonl").write_text(json.dumps({"text": "alpha bravo"}) + "\n")
    for name, note in (("empty", "0 item(s)"), ("punct", "1 item(s)"), ("words", None)):
        notes: list[str] = []
        with _benchmarks(set_recipe(tmp_path, [tmp_path / f"{name}.jsonl"], ["text"], None), [], None, notes):
            pass
        said = [n for n in notes if n.startswith("decontaminate: benchmark")]
        assert said == ([] if note is None else [
            f"decontaminate: benchmark bench: {note} and not one word among them: it takes nothing (its files: "
            f"{tmp_path / name}.jsonl)"]), name


def test_a_truncated_compressed_benchmark_file_is_named(tmp_path):
    """A .jsonl.gz or .jsonl.zst benchmark cut short (a download that stopped) is refused as truncated, as a
    stream's file is: a zstd file so cut gave no item at all, without a word, and a gzip one cut after a line
    the items before the cut."""
    import gzip

    import zstandard

    data = "".join(json.dumps({"text": f"item {i}"}) + "\n" for i in range(100)).encode()
    whole = {"gz": gzip.compress(data), "zst": zstandard.ZstdCompressor().compress(data)}
    for codec, packed in whole.items():
        path = tmp_path / f"items.jsonl.{codec}"
        path.write_bytes(packed)
        assert len(read_items(path, ["text"])) == 100
        path.write_bytes(packed[:-12])
        said = read_items(path, ["text"])
        assert said == f"benchmark b: file {path}: truncated: it ends inside a compressed member or frame", codec


def test_a_plain_text_benchmark_with_lone_carriage_returns_is_named(tmp_path):
    """A plain-text file whose lines end with \\r alone (old Mac line ends) was one item: every line's words
    one run, n-grams across its lines, its short lines no longer matched whole. Refused with the line, as a JSONL
    file's are; \\r\\n ends are read as before."""
    path = tmp_path / "items.txt"
    path.write_bytes(b"first item here\rsecond item\rthird\r")
    assert read_items(path, ["text"]) == (f"benchmark b: file {path}: line 1: holds a carriage return (\\r) that "
                                          "no \\n follows: lines end with \\n or \\r\\n only (convert the file's "
                                          "line ends)")
    path.write_bytes(b"first item here\r\nsecond item\r\n")
    assert read_items(path, ["text"]) == [("0", "first item here"), ("1", "second item")]
