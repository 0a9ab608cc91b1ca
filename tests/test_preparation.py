"""Data prepared once (`data.preparation`): the same tokens as the tokenizer gives, in the narrowest id type; a
cache keyed by content that is reused, never stale or half-written, and prepares only the splits asked for;
evaluation splits kept whole; readers that stream and name the line of bad input at any size; numpy reads of Arrow
offsets, and batches packed as before."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset

from vaswani_hf.data.batching import TokenBudgetBatchSampler
from vaswani_hf.data.number_words import number_pairs
from vaswani_hf.data.preparation import prepare
from vaswani_hf.data.prepared import PreparedData, token_lengths
from vaswani_hf.data.prepared_cache import PreparationRequest, cache_dir
from vaswani_hf.data.readers import jsonl_chunks, load_split, split_chunks

from .helpers import TINY_RUN, vaswani

PAIRS = number_pairs(300, seed=0)


def write_corpus(folder: Path, pairs=PAIRS, val=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", pairs), ("val", val or number_pairs(20, seed=1))):
        for side, lang in ((0, "en"), (1, "de")):
            (folder / f"{split}.{lang}").write_text("".join(row[side] + "\n" for row in rows))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VASWANI_PREPARED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def source(folder, **options) -> PreparationRequest:
    return PreparationRequest(str(folder), "en", "de", vocab_size=options.pop("vocab_size", 120), **options)


def test_prepared_tokens_are_the_tokenizers_and_counts_are_recorded(tmp_path, cache):
    pairs = [*PAIRS, ("  ", "leer"), (" twenty" * 80, "zwanzig ")]  # one empty source, one too long
    folder = write_corpus(tmp_path / "data", pairs)
    prepared = prepare(source(folder, max_length=64), workers=1, quiet=True, eval_splits=["val"])
    tokenizer = prepared.tokenizer()
    tokens = prepared.tokens("train")
    kept = [(s.strip(), t.strip()) for s, t in pairs if s.strip() and len(tokenizer(s.strip())["input_ids"]) <= 64]
    expected = tokenizer([s for s, _ in kept], text_target=[t for _, t in kept])
    assert tokens["input_ids"] == expected["input_ids"] and tokens["labels"] == expected["labels"]
    assert str(tokens.features["input_ids"].feature.dtype) == "uint16"  # 120 entries: two bytes an id
    assert token_lengths(tokens)[0].tolist() == [len(x) for x in expected["input_ids"]]
    assert prepared.counts("train") == {"read": 302, "dropped_empty": 1, "pairs": 300, "dropped_too_long": 1}
    assert prepared.counts("val")["pairs"] == 20  # evaluation splits are never filtered by length
    assert [f["path"] for f in prepared.manifest["files"]][0].endswith("train.en")
    # no copy of the training text: what wants it (BPE-dropout) decodes the ids back to the text as read
    assert not list((prepared.path / "splits" / "train").glob("text*"))
    decoded = prepared.pairs("train")
    assert len(decoded) == 300 and [decoded[i] for i in (0, 5, 299)] == [kept[i] for i in (0, 5, 299)]


def test_worker_processes_give_the_same_files_as_one(tmp_path, monkeypatch):
    from vaswani_hf.data import preparation

    monkeypatch.setattr(preparation, "SHARD_ROWS", 70)  # five shards: a pool of 2 workers takes them
    folder = write_corpus(tmp_path / "data")
    one = prepare(source(folder), tmp_path / "one", workers=1, quiet=True)
    assert one.manifest["counts"]["read"] == 300
    two = prepare(source(folder), tmp_path / "two", workers=2, quiet=True)
    assert len(list((tmp_path / "two" / "splits" / "train").glob("tokens-*.arrow"))) == 5
    assert one.tokens("train")[:] == two.tokens("train")[:]


def test_the_cache_is_reused_and_prepared_again_when_anything_changes(tmp_path, cache):
    folder = write_corpus(tmp_path / "data")
    first = prepare(source(folder), quiet=True)
    assert not first.reused and first.path.parent == cache == cache_dir()
    again = prepare(source(folder), quiet=True)
    assert again.reused and again.path == first.path
    changed = {
        "vocabulary size": source(folder, vocab_size=130),
        "max_length": source(folder, max_length=10),
        "a given tokenizer": source(folder, tokenizer=str(first.path / "tokenizer")),
    }
    paths = {first.path}
    for why, other in changed.items():
        prepared = prepare(other, quiet=True)
        assert not prepared.reused and prepared.path not in paths, why
        paths.add(prepared.path)
    # one character fixed in place, the size and the modification time restored (`touch -r`): new content
    train_de = folder / "train.de"
    (tmp_path / "stamp").write_text("")
    subprocess.run(["touch", "-r", str(train_de), str(tmp_path / "stamp")], check=True)
    size = train_de.stat().st_size
    train_de.write_text(train_de.read_text().replace("eins", "Eins", 1))
    subprocess.run(["touch", "-r", str(tmp_path / "stamp"), str(train_de)], check=True)
    assert train_de.stat().st_size == size and train_de.stat().st_mtime_ns == (tmp_path / "stamp").stat().st_mtime_ns
    edited = prepare(source(folder), quiet=True)
    assert not edited.reused and edited.path not in paths
    assert PreparedData(first.path).stale_files() == [str(train_de.resolve())]


def test_only_the_splits_asked_for_are_prepared_and_a_new_one_alone(tmp_path, cache):
    folder = write_corpus(tmp_path / "data")
    first = prepare(source(folder), quiet=True, eval_splits=["val"])
    assert first.splits == ["train", "val"]
    shard = first.path / "splits" / "train" / "tokens-00000.arrow"
    written = shard.stat().st_mtime_ns
    # files added later: a one-sided subword-nmt vocabulary, and a new test set
    (folder / "vocab.en").write_text("the 10\n")
    for lang, rows in (("en", ["one", "", "three"]), ("de", ["eins", "zwei", ""])):
        (folder / f"newstest2015.{lang}").write_text("\ufeff" + "\n".join(rows) + "\n")  # with a byte-order mark
    again = prepare(source(folder), quiet=True, eval_splits=["val"])
    assert again.reused and again.path == first.path and again.splits == ["train", "val"]
    added = prepare(source(folder), quiet=True, eval_splits=["val", "newstest2015"])
    assert added.path == first.path and shard.stat().st_mtime_ns == written  # the training split is not redone
    # an evaluation split keeps every pair, an empty side included, and the byte-order mark is gone
    assert added.counts("newstest2015") == {"read": 3, "dropped_empty": 0, "pairs": 3, "dropped_too_long": 0}
    assert list(added.pairs("newstest2015")) == [("one", "eins"), ("", "zwei"), ("three", "")]
    # a split's staging folder left by a killed preparation is never a split, and the next preparation sweeps it
    killed = added.path / "splits" / ".newstest2015.tmp-deadbeef"
    killed.mkdir()
    (killed / "split.json").write_text("{}")
    assert PreparedData(added.path).splits == ["train", "newstest2015", "val"]
    # and a changed evaluation split is prepared again, alone
    (folder / "newstest2015.de").write_text("eins\nzwei\ndrei\n")
    redone = prepare(source(folder), quiet=True, eval_splits=["newstest2015"])
    assert redone.pairs("newstest2015")[2] == ("three", "drei") and shard.stat().st_mtime_ns == written
    assert not killed.exists()


def test_ids_wider_than_two_bytes_are_stored_as_int32():
    import pyarrow as pa
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from vaswani_hf.data.prepared import encode_table

    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(70_000)}, unk_token="w3"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A w2", special_tokens=[("w2", 2)])
    table = pa.table({"source": ["w69999 w65536", "w5"], "target": ["w65535", "w70001"]})
    tokens, kept = encode_table(tokenizer, table, None)
    assert tokens.schema.field("input_ids").type == pa.list_(pa.int32()) and kept.tolist() == [0, 1]
    assert tokens.to_pydict() == {"input_ids": [[69999, 65536, 2], [5, 2]], "labels": [[65535, 2], [3, 2]]}


def test_clearing_the_cache_takes_each_lock_and_space_is_checked_first(tmp_path, cache, monkeypatch):
    import shutil as shutil_module

    from filelock import FileLock

    from vaswani_hf.data import prepared_cache
    from vaswani_hf.data.prepared_cache import clear_cache

    folder = write_corpus(tmp_path / "data")
    prepared = prepare(source(folder), quiet=True)
    said = []
    with FileLock(str(cache / f".{prepared.path.name}.lock")):  # another process preparing it
        assert clear_cache(said.append)[1] > 0
        assert prepared.path.is_dir() and "being prepared by another process" in said[0]
    assert clear_cache(said.append)[1] > 0 and not prepared.path.exists()
    Usage = type(shutil_module.disk_usage(tmp_path))
    monkeypatch.setattr(prepared_cache.shutil, "disk_usage", lambda path: Usage(10**12, 10**12, 1000))
    with pytest.raises(OSError, match=r"not enough free disk space in .*: about 62 kB is needed while preparing, 1 kB"):
        prepare(source(folder), quiet=True)


def test_a_stale_staging_folder_is_never_trusted_and_is_cleared(tmp_path, cache):
    folder = write_corpus(tmp_path / "data")
    key = source(folder).key()[0]
    staging = cache / f".{key}.tmp-deadbeef"
    (staging / "splits" / "train").mkdir(parents=True)
    (staging / "splits" / "train" / "tokens-00000.arrow").write_bytes(b"half a file")
    other = cache / ".0123456789abcdef0123.tmp-cafecafe"  # another key's, killed: its lock is free
    other.mkdir()
    prepared = prepare(source(folder), quiet=True)
    assert not prepared.reused and not staging.exists() and len(prepared.tokens("train")) == 300
    assert not other.exists()


KILLED = """
import sys, time
from vaswani_hf.data import preparation
from vaswani_hf.data import prepared_cache
real = preparation._tokenize
def tokenize_then_hang(*args, **kwargs):
    real(*args, **kwargs)
    print("tokenized", flush=True)
    time.sleep(600)
preparation._tokenize = tokenize_then_hang
preparation.prepare(prepared_cache.PreparationRequest(sys.argv[1], "en", "de", vocab_size=120), workers=1, quiet=True)
"""


def test_a_preparation_killed_midway_leaves_nothing_a_later_run_trusts(tmp_path, cache):
    folder = write_corpus(tmp_path / "data")
    process = subprocess.Popen([sys.executable, "-c", KILLED, str(folder)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "VASWANI_PREPARED_CACHE": str(cache)})  # fmt: skip
    assert process.stdout.readline().strip() == "tokenized"  # tokens written, the manifest not yet
    process.send_signal(signal.SIGKILL)
    process.wait()
    key = source(folder).key()[0]
    assert not PreparedData.is_prepared(cache / key) and list(cache.glob(f".{key}.tmp-*"))
    prepared = prepare(source(folder), quiet=True)
    assert not prepared.reused and not list(cache.glob(f".{key}.tmp-*"))


RACER = """
import sys
from vaswani_hf.data import preparation
from vaswani_hf.data import prepared_cache
p = preparation.prepare(prepared_cache.PreparationRequest(sys.argv[1], "en", "de", vocab_size=120), workers=1)
print("reused" if p.reused else "built", p.path)
"""


def test_two_runs_at_once_prepare_once(tmp_path, cache):
    folder = write_corpus(tmp_path / "data", number_pairs(3000, seed=0))
    env = {**os.environ, "VASWANI_PREPARED_CACHE": str(cache)}
    runs = [subprocess.Popen([sys.executable, "-c", RACER, str(folder)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]  # fmt: skip
    outputs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outputs]
    said = sorted(out.split()[0] for out, _ in outputs)
    assert said == ["built", "reused"]
    assert len({out.split()[1] for out, _ in outputs}) == 1
    assert sum("tokenizing train" in err for _, err in outputs) == 1


# --- the readers stream, and name the file and line of bad input at any size ------------------------------------


def big_lines(count: int, bad_at: int, bad: str) -> str:
    return "".join((bad if number == bad_at else f"line {number}") + "\n" for number in range(1, count + 1))


@pytest.mark.parametrize(
    "files, message",
    [
        ({"train.en": big_lines(5000, 3500, "caf\udce9"), "train.de": big_lines(5000, 0, "")},
         r"train.en: line 3500 is not valid UTF-8"),
        ({"train.en": big_lines(5000, 0, ""), "train.de": big_lines(5001, 0, "")},
         r"train.en has 5000 lines but .*train.de has 5001"),
        ({"train.tsv": big_lines(5000, 4321, "no tab here").replace("line", "a\tb")},
         r"train.tsv: line 4321 has 1 tab-separated fields"),
        ({"train.jsonl": "".join("{oops\n" if n == 2999 else f'{{"en": "a {n}", "de": "b"}}\n'
                                 for n in range(1, 5001))},
         r"train.jsonl: line 2999 is not valid JSON"),
    ],
    ids=["utf-8", "misaligned", "tsv", "jsonl"],
)  # fmt: skip
def test_bad_input_deep_in_a_file_is_named_by_file_and_line(files, message, tmp_path, cache):
    for name, content in files.items():
        (tmp_path / name).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=message):
        list(split_chunks(str(tmp_path), "train", "en", "de", chunk_lines=1000))
    with pytest.raises(ValueError, match=message):  # and through a preparation, which leaves nothing behind
        prepare(source(tmp_path), quiet=True)
    assert not [p for p in cache.iterdir() if p.is_dir()]


def test_jsonl_read_by_arrow_matches_the_line_by_line_reader(tmp_path):
    rows = ['{"translation": {"en": " one ", "de": "eins"}}', '{"translation": {"de": "zwei", "en": "two"}}', "",
            '{"translation": {"en": "three", "de": "drei", "fr": "trois"}}']  # fmt: skip
    (tmp_path / "nested.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "flat.jsonl").write_text('{"en": "a", "de": "b", "id": 1}\n{"en": "c", "de": "d", "id": 2}\n')
    nested = [t.to_pylist() for t in jsonl_chunks(tmp_path / "nested.jsonl", "en", "de", chunk_lines=2)]
    assert [(r["source"], r["target"], r["line"]) for chunk in nested for r in chunk] == [
        ("one", "eins", 1), ("two", "zwei", 2), ("three", "drei", 4)]  # fmt: skip
    flat = load_split(str(tmp_path), "flat", "en", "de")
    assert flat == [("a", "b"), ("c", "d")]


def test_lines_end_at_newlines_only(tmp_path):
    # str.splitlines would also break at U+2028 or a form feed, and shift one side against the other
    (tmp_path / "train.en").write_text("a\u2028b\nc\x0cd\r\n")
    (tmp_path / "train.de").write_text("x\ny\n")
    assert load_split(str(tmp_path), "train", "en", "de") == [("a\u2028b", "x"), ("c\x0cd", "y")]


# --- numpy reads of Arrow columns, and batches packed in numpy ------------------------------------------------------


def test_token_lengths_read_arrow_offsets_and_follow_selections():
    rows = [[1] * (n % 7 + 1) for n in range(1000)]
    dataset = Dataset.from_dict({"input_ids": rows, "labels": [r + [2] for r in rows]})
    sources, targets = token_lengths(dataset)
    assert sources.tolist() == [len(r) for r in rows] and targets.tolist() == [len(r) + 1 for r in rows]
    picked = dataset.select([5, 3, 999]).shuffle(seed=0)
    assert token_lengths(picked)[0].tolist() == [len(r) for r in picked["input_ids"]]


def reference_pack(sorted_lengths, max_tokens, buckets):
    """The packing loop as first written, one Python step per pair: the numpy version must give its batches."""
    bounds, start = [], 0
    padded = sorted_lengths if buckets is None else np.asarray(buckets)[np.searchsorted(buckets, sorted_lengths)]
    for end, length in enumerate(padded.tolist()):
        new_bucket = buckets is not None and length != padded[start]
        if end > start and ((end - start + 1) * length > max_tokens or new_bucket):
            bounds.append((start, end))
            start = end
    bounds.append((start, len(sorted_lengths)))
    return bounds


@pytest.mark.parametrize("seed", range(12))
def test_numpy_packing_gives_the_batches_of_the_loop(seed):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 3000))
    source, target = rng.integers(1, 200, count), rng.integers(1, 200, count)
    max_tokens = int(rng.integers(200, 4000))
    buckets = [8, 16, 32, 64, 128, 200] if seed % 2 else None
    sampler = TokenBudgetBatchSampler(source, target, max_tokens, buckets=buckets)
    lengths = np.sort(np.maximum(source, target))
    assert sampler.bounds == reference_pack(lengths, max_tokens, buckets)


@pytest.mark.parametrize("longest", [300, 5000])  # a table of (source, target) lengths, and np.unique past it
def test_length_order_is_lexsorts_and_shuffles_only_ties(longest):
    rng = np.random.default_rng(longest)
    source, target = rng.integers(1, longest, 5000), rng.integers(1, longest // 50, 5000)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=10**6)
    keys = (target, source, np.maximum(source, target))
    assert sampler._length_order(None).tolist() == np.lexsort(keys).tolist()
    shuffled = sampler._length_order(np.random.default_rng(1))
    assert sorted(shuffled.tolist()) == list(range(5000))
    assert all((key[shuffled] == key[np.lexsort(keys)]).all() for key in keys)  # the same lengths at each place
    assert shuffled.tolist() != np.lexsort(keys).tolist()  # ties in another order
    assert shuffled.tolist() == sampler._length_order(np.random.default_rng(1)).tolist()  # seeded: resumable


# --- the commands ------------------------------------------------------------------------------------------------


def test_prepare_then_train_on_the_prepared_folder_and_reuse_the_cache(tmp_path, cache):
    folder = write_corpus(tmp_path / "data")
    prepared = tmp_path / "prepared"
    result = vaswani("prepare", "--data", str(folder), "--vocab_size", "120", "--output_dir", str(prepared))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"train on it with `vaswani train --data {prepared}" in result.stdout
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["counts"]["pairs"] == 300 and manifest["vocabulary"]["size"] == 120
    assert "(splits: train, val)" in result.stdout  # the default evaluation split, where the data holds it

    run = [*TINY_RUN, "--src", "en", "--tgt", "de", "--save_strategy", "no"]
    trained = vaswani("train", "--data", str(prepared), *run, "--output_dir", str(tmp_path / "a"))
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert f"data: the prepared data in {prepared}" in trained.stderr and "tokenizing" not in trained.stderr
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (prepared / "tokenizer" / "tokenizer.json").read_text()

    first = vaswani("train", "--data", str(folder), *run, "--output_dir", str(tmp_path / "b"))
    second = vaswani("train", "--data", str(folder), *run, "--output_dir", str(tmp_path / "c"))
    assert first.returncode == second.returncode == 0, (first.stderr + second.stderr)[-3000:]
    assert "data: prepared into" in first.stderr and "data: reused the prepared data" in second.stderr
    reused = vaswani("train", "--data", str(folder), *run, "--tokenizer", str(tmp_path / "b"),
                     "--output_dir", str(tmp_path / "d"))  # fmt: skip
    assert reused.returncode == 0 and "data: prepared into" in reused.stderr  # the given vocabulary, tokenized once
    assert "learning the shared BPE" not in reused.stderr

    cleared = vaswani("prepare", "--clear_cache")
    assert cleared.returncode == 0 and f"cleared {cache}" in cleared.stdout
    assert not [p for p in cache.iterdir() if not p.name.endswith(".lock")]


def test_prepare_shows_and_takes_no_training_options(tmp_path):
    shown = vaswani("prepare", "--help")
    assert shown.returncode == 0 and "--bpe_sample_lines" in shown.stdout
    assert not {"--bpe_dropout", "--max_eval_samples", "--metric"} & set(shown.stdout.split())
    given = vaswani("prepare", "--data", str(tmp_path), "--bpe-dropout=0.1", "--output_dir", str(tmp_path / "out"))
    assert given.returncode == 2 and "--bpe_dropout: a training option, not a preparation one" in given.stderr
    assert not (tmp_path / "out").exists()


def test_a_prepared_folder_of_another_language_pair_is_refused(tmp_path):
    prepare(source(write_corpus(tmp_path / "data")), tmp_path / "prepared", quiet=True)
    result = vaswani("train", "--data", str(tmp_path / "prepared"), "--src", "de", "--tgt", "en", *TINY_RUN)
    assert result.returncode == 2 and "holds en->de data, not de->en: check --src/--tgt" in result.stderr


def test_the_scale_benchmark_runs_at_a_size_of_seconds(tmp_path):
    write_corpus(tmp_path / "corpus-300")  # the benchmark generates a corpus only where none is
    out = tmp_path / "table.md"
    script = Path(__file__).parents[1] / "benchmarks" / "scale.py"
    command = [sys.executable, str(script), "--sizes", "300", "--work", str(tmp_path), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    row = next(line for line in out.read_text().splitlines() if line.startswith("| 300 |"))
    assert row.count("GiB") == 2 and "CPU: " in out.read_text()


# --- the word-by-word tokenizing trick (vaswani_hf.data.word_tokenizing): the same ids as the tokenizer whole ---------


TRICKY = ["x  y", "x ▁b", "a▁b", "foo</s>bar <unk>", "a\tb", "ab,cd ... (e) ?", " lead", "trail ", "", "Ünï wörd .",
          "<pad>", "twenty-one , seven", "a" * 300, "日本語 の 文", "x\u00a0y z"]  # fmt: skip


@pytest.mark.parametrize("split_punctuation", [True, False])
def test_tokenizing_word_by_word_gives_the_tokenizers_ids(split_punctuation):
    import pyarrow as pa

    from vaswani_hf.data import word_tokenizing
    from vaswani_hf.data.prepared import encode_table
    from vaswani_hf.data.tokenization import train_shared_bpe

    rng = np.random.default_rng(0)
    alphabet = list("abcdefgh ,.-'ÄöÜß▁") + ["  ", "</s>"]
    random = ["".join(rng.choice(alphabet, rng.integers(0, 40))) for _ in range(500)]
    texts = [*TRICKY, *(s for pair in PAIRS for s in pair), *random]
    tokenizer = train_shared_bpe(texts, 150, split_punctuation=split_punctuation).backend_tokenizer
    assert word_tokenizing.applies(tokenizer)
    table = pa.table({"source": pa.array(texts, pa.large_string()), "target": pa.array(texts[::-1], pa.large_string())})
    (whole, _), (by_words, _) = encode_table(tokenizer, table, None), encode_table(tokenizer, table, None, words={})
    assert whole.equals(by_words)
    assert whole.column("input_ids").to_pylist() == [e.ids for e in tokenizer.encode_batch(texts)]


def test_the_word_trick_is_off_for_other_tokenizers_and_by_its_switch(monkeypatch, tmp_path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from vaswani_hf.data import word_tokenizing
    from vaswani_hf.data.tokenization import train_shared_bpe

    ours = train_shared_bpe([s for pair in PAIRS for s in pair], 150).backend_tokenizer
    lowercased = Tokenizer.from_str(ours.to_str())
    lowercased.normalizer = normalizers.Lowercase()
    by_whitespace = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    by_whitespace.pre_tokenizer = pre_tokenizers.Whitespace()
    assert word_tokenizing.applies(ours)
    assert not word_tokenizing.applies(lowercased) and not word_tokenizing.applies(by_whitespace)
    monkeypatch.setenv("VASWANI_WORD_TOKENIZING", "0")
    assert not word_tokenizing.applies(ours)
    # and a preparation with the trick off writes the same tokens
    folder = write_corpus(tmp_path / "data")
    off = prepare(source(folder), tmp_path / "off", workers=1, quiet=True)
    monkeypatch.delenv("VASWANI_WORD_TOKENIZING")
    on = prepare(source(folder), tmp_path / "on", workers=1, quiet=True)
    assert off.tokens("train")[:] == on.tokens("train")[:]


def test_a_datasets_dataset_prepares_from_its_arrow_files(tmp_path, cache):
    folder = tmp_path / "ds"  # a dataset folder that `datasets.load_dataset` reads, as it reads a Hub dataset
    folder.mkdir()
    for split, rows in (("train", PAIRS), ("validation", PAIRS[:5])):
        records = [{"translation": {"en": s, "de": t}} for s, t in rows]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    hub = PreparationRequest(str(folder), "en", "de", hub=True, vocab_size=120)
    prepared = prepare(hub, quiet=True, eval_splits=["validation"])
    assert prepared.splits == ["train", "validation"] and len(prepared.tokens("train")) == len(PAIRS)
    assert prepared.text("validation")["target"] == [t for _, t in PAIRS[:5]]
    assert "fingerprint" in prepared.manifest["files"][0] and prepare(hub, quiet=True).reused


def test_an_evaluation_split_the_data_lacks_is_an_error_not_a_skipped_evaluation(tmp_path):
    folder = write_corpus(tmp_path / "data")
    result = vaswani("train", "--data", str(folder), *TINY_RUN, "--eval_split", "test2016",
                     "--output_dir", str(tmp_path / "out"))  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--eval_split test2016: the data holds no such split (it has train, val)" in result.stderr
