"""Section 5.1's data at the paper's scale, prepared once: text read into Arrow, the shared BPE vocabulary trained,
every split tokenized, in a folder that training runs memory-map.

`prepare()` streams each split of a data folder (or Hub dataset) into Arrow a chunk at a time, trains the shared
BPE (or takes `--tokenizer`), tokenizes in worker processes, drops training pairs longer than `--max_length`, and
writes a manifest: the source files (size, modification time, a sampled content hash), the options, the counts, and
what was dropped and why. A preparation is built in a temporary folder and renamed into place, under a file lock:
a killed preparation leaves nothing a later run trusts, and two runs (or two DDP ranks) never build the same one at
once.

`vaswani prepare --output_dir DIR` writes one where the user says; `vaswani train --data RAW` keeps them in a cache
(`cache_dir()`), keyed by everything that changes the result, so a resumed run, a rerun, or a second run with the
same data and vocabulary options starts from the prepared data. Layout of a prepared folder:

    manifest.json   tokenizer/   splits/{split}/text.arrow   splits/{split}/tokens-NNNNN.arrow
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets
from filelock import FileLock, Timeout
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from . import word_tokenizing
from .data import EmptyPairs, folder_splits, split_chunks, split_files
from .tokenization import train_shared_bpe

logger = logging.getLogger(__name__)

FORMAT = 1  # raise when the layout or the tokenized columns change: older preparations are then made anew
MANIFEST = "manifest.json"
SHARD_ROWS = 100_000  # rows a tokenizing task takes: small enough for a steady progress bar
BATCH_ROWS = 10_000  # rows tokenized in one call


def cache_dir() -> Path:
    """Where `vaswani train --data RAW` keeps its preparations: $VASWANI_PREPARED_CACHE, else
    `vaswani_prepared/` in the 🤗 Datasets cache ($HF_DATASETS_CACHE, by default ~/.cache/huggingface/datasets)."""
    if os.environ.get("VASWANI_PREPARED_CACHE"):
        return Path(os.environ["VASWANI_PREPARED_CACHE"])
    import datasets.config

    return Path(datasets.config.HF_DATASETS_CACHE) / "vaswani_prepared"


def default_workers() -> int:
    """Tokenizing processes: one per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def numpy_column(dataset: Dataset, name: str) -> np.ndarray:
    """A column as one numpy array read from Arrow. (`dataset.with_format("numpy")[name]` is a lazy column in
    datasets 4 and later that numpy reads row by row through the formatter: minutes at WMT's size.)"""
    values = dataset.data.column(name).to_numpy()
    indices = dataset._indices  # what select() or shuffle() left: an Arrow table of row numbers
    return values if indices is None else values[indices.column(0).to_numpy()]


@dataclass(frozen=True)
class Source:
    """What to prepare: a data folder or Hub dataset, its language pair, and the options that change the result."""

    data: str
    src: str
    tgt: str
    hub: bool = False
    config: str | None = None
    vocab_size: int = 37000
    split_punctuation: bool = True
    bpe_sample_lines: int | None = None
    tokenizer: str | None = None  # a saved tokenizer (folder or tokenizer.json) used instead of training BPE
    max_length: int | None = 256
    train_split: str = "train"

    def splits(self) -> list[str]:
        if self.hub:
            from datasets import get_dataset_split_names

            return list(get_dataset_split_names(self.data, self.config))
        folder = Path(self.data)
        if not folder.is_dir():
            raise FileNotFoundError(f"--data {self.data}: no such folder (expected {self.train_split}.{self.src} + "
                                    f"{self.train_split}.{self.tgt} inside).")  # fmt: skip
        found = folder_splits(folder, self.src, self.tgt)
        if self.train_split not in found:
            list(split_chunks(self.data, self.train_split, self.src, self.tgt))  # raises the reader's error
        return found

    def files(self) -> list[dict]:
        """The files read, with what identifies their content; a Hub dataset is named by its fingerprint."""
        if self.hub:
            from datasets import load_dataset

            return [{"dataset": self.data, "config": self.config, "split": split,
                     "fingerprint": load_dataset(self.data, self.config, split=split)._fingerprint}
                    for split in self.splits()]  # fmt: skip
        return [file_identity(path) for split in self.splits()
                for path in split_files(Path(self.data), split, self.src, self.tgt)]  # fmt: skip

    def vocabulary(self) -> dict:
        if self.tokenizer:
            return {"tokenizer": str(Path(self.tokenizer).resolve()), "sha256": tokenizer_hash(self.tokenizer)}
        return {"bpe": {"vocab_size": self.vocab_size, "split_punctuation": self.split_punctuation,
                        "sample_lines": self.bpe_sample_lines}}  # fmt: skip

    def key(self) -> tuple[str, dict]:
        """The cache key, and its inputs for the manifest: the files (path, size, modification time; their sampled
        content hash is recorded, not hashed), the language pair, the vocabulary (options, or the given tokenizer's
        content), `max_length`, and the format."""
        inputs = {"format": FORMAT, "files": self.files(), "src": self.src, "tgt": self.tgt,
                  "train_split": self.train_split, "vocabulary": self.vocabulary(),
                  "max_length": self.max_length}  # fmt: skip
        hashed = {**inputs, "files": [{k: v for k, v in f.items() if k != "sample_sha256"} for f in inputs["files"]]}
        return hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:20], inputs


def file_identity(path: Path) -> dict:
    """Path, size, modification time, and a hash of 64 samples of 64 KiB spread over the file (cheap at any size:
    the key uses size and time; the hash tells a reader of the manifest which content was prepared)."""
    stat = path.stat()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for offset in sorted({stat.st_size * i // 64 for i in range(64)}):
            file.seek(offset)
            digest.update(file.read(1 << 16))
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "sample_sha256": digest.hexdigest()}  # fmt: skip


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """A saved fast tokenizer: a folder (`AutoTokenizer`) or a tokenizer.json file."""
    path = Path(path)
    if path.is_file():
        return PreTrainedTokenizerFast(tokenizer_file=str(path), pad_token="<pad>", bos_token="<s>",
                                       eos_token="</s>", unk_token="<unk>")  # fmt: skip
    if not path.is_dir():
        raise FileNotFoundError(f"--tokenizer {path}: no such file or folder; give a folder with tokenizer.json "
                                "(a model's, or a prepared folder's tokenizer/) or the file itself.")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.is_fast:
        raise ValueError(f"--tokenizer {path}: a slow (Python) tokenizer; give a folder with tokenizer.json.")
    return tokenizer


def tokenizer_hash(path: str | Path) -> str:
    return hashlib.sha256(load_tokenizer(path).backend_tokenizer.to_str().encode()).hexdigest()


class PreparedData:
    """A prepared folder: its tokenizer, and each split's text and tokens as memory-mapped `datasets.Dataset`s.
    Tokens: `input_ids`, `labels` (with </s>), `source_length`, `target_length`, and `pair`, the row of the
    split's text it came from."""

    def __init__(self, path: str | Path, reused: bool = True) -> None:
        self.path = Path(path)
        manifest = self.path / MANIFEST
        if not manifest.is_file():
            raise FileNotFoundError(f"{self.path} is not a prepared folder (no {MANIFEST}): prepare it with "
                                    "`vaswani prepare --data RAW --output_dir DIR`.")  # fmt: skip
        self.manifest = json.loads(manifest.read_text())
        if self.manifest.get("format") != FORMAT:
            raise ValueError(f"{self.path} was prepared by another version of vaswani-hf (format "
                             f"{self.manifest.get('format')}, this one reads {FORMAT}): prepare it again.")  # fmt: skip
        self.reused = reused

    @staticmethod
    def is_prepared(path: str | Path | None) -> bool:
        return path is not None and (Path(path) / MANIFEST).is_file()

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["splits"])

    def tokenizer(self) -> PreTrainedTokenizerFast:
        return AutoTokenizer.from_pretrained(self.path / "tokenizer")

    def _split_dir(self, split: str) -> Path:
        if split not in self.manifest["splits"]:
            raise ValueError(f"{self.path} holds no split {split!r} (it has {', '.join(self.splits)}).")
        return self.path / "splits" / split

    def text(self, split: str) -> Dataset:
        return Dataset.from_file(str(self._split_dir(split) / "text.arrow"))

    def tokens(self, split: str) -> Dataset:
        shards = sorted(self._split_dir(split).glob("tokens-*.arrow"))
        return concatenate_datasets([Dataset.from_file(str(shard)) for shard in shards])

    def stale_files(self) -> list[str]:
        """Source files that changed since they were prepared (or are gone)."""
        stale = []
        for known in self.manifest["files"]:
            path = Path(known.get("path", ""))
            if "path" in known and (not path.is_file() or path.stat().st_size != known["size"]
                                    or path.stat().st_mtime_ns != known["mtime_ns"]):  # fmt: skip
                stale.append(str(path))
        return stale

    def describe(self) -> str:
        train = self.manifest["splits"][self.manifest["train_split"]]
        return (f"{train['pairs']:,} training pairs ({train['dropped_empty']:,} dropped with an empty side, "
                f"{train['dropped_too_long']:,} longer than {self.manifest['max_length']} tokens)")  # fmt: skip


class InMemoryData(PreparedData):
    """Pairs held in memory (the built-in task, a small fine-tuning set, the Python API), tokenized as `prepare`
    tokenizes, with the same splits, columns and counts."""

    def __init__(self, pairs: dict[str, Sequence[tuple[str, str]]], tokenizer: PreTrainedTokenizerBase,
                 train_split: str = "train", max_length: int | None = None) -> None:  # fmt: skip
        self.path, self.reused, self._tokenizer = Path("<memory>"), False, tokenizer
        encoder = tokenizer.backend_tokenizer if tokenizer.is_fast else tokenizer
        self._text, self._tokens, counts = {}, {}, {}
        for split, rows in pairs.items():
            sources, targets = zip(*rows, strict=True) if rows else ((), ())
            text = pa.table({"source": pa.array(sources, pa.large_string()),
                             "target": pa.array(targets, pa.large_string()),
                             "line": pa.array(range(1, len(rows) + 1), pa.int64())})  # fmt: skip
            limit = max_length if split == train_split else None
            self._text[split] = Dataset(text)
            words = {} if word_tokenizing.applies(encoder) else None
            self._tokens[split] = Dataset(encode_table(encoder, text, 0, limit, words))
            counts[split] = {"read": len(rows), "dropped_empty": 0, "pairs": len(self._tokens[split])}
            counts[split]["dropped_too_long"] = len(rows) - counts[split]["pairs"]
        self.manifest = {"splits": counts, "train_split": train_split, "max_length": max_length}
        if train_split in counts:
            check_filtered(counts[train_split], max_length)

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def text(self, split: str) -> Dataset:
        return self._text[split]

    def tokens(self, split: str) -> Dataset:
        return self._tokens[split]


def check_filtered(counts: dict, max_length: int | None) -> None:
    """Say how many training pairs `max_length` dropped; refuse a training set it emptied."""
    if counts["read"] - counts["dropped_empty"] and not counts["pairs"]:
        raise ValueError(f"every training pair is longer than --max_length={max_length} tokens: raise it.")
    if counts["dropped_too_long"]:
        logger.warning("dropped %d of %d training pairs longer than --max_length=%d tokens",
                       counts["dropped_too_long"], counts["read"], max_length)  # fmt: skip


class PairRows(Sequence):
    """(source, target) texts of the given rows of a split's text, read one pair at a time (BPE-dropout)."""

    def __init__(self, text: Dataset, rows: np.ndarray) -> None:
        self.table, self.rows = text.data.table, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[str, str]:
        row = int(self.rows[index])
        return self.table.column("source")[row].as_py(), self.table.column("target")[row].as_py()


def say(message: str, quiet: bool = False) -> None:
    """A progress line on stderr (the summary goes to stdout)."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def prepare(source: Source, output_dir: str | Path | None = None, workers: int | None = None,
            quiet: bool = False) -> PreparedData:  # fmt: skip
    """The prepared data for `source`: in `output_dir`, or in the cache under the source's key when none is
    given. An existing preparation with the same key is reused; otherwise it is built under a lock."""
    key, inputs = source.key()
    final = Path(output_dir) if output_dir is not None else cache_dir() / key
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=1)
    except Timeout:
        say(f"data: waiting for another process that is preparing {final} (lock {lock.lock_file})", quiet)
        lock.acquire()
    try:
        if PreparedData.is_prepared(final):
            found = PreparedData(final)
            if found.manifest.get("key") == key:
                say(f"data: reused the prepared data in {final}: {found.describe()}", quiet)
                return found
            if output_dir is None:
                raise RuntimeError(f"{final} holds a preparation with another key: clear the cache.")
            raise ValueError(f"{final} holds data prepared from other files or options: give another --output_dir, "
                             "or delete it.")  # fmt: skip
        if final.exists() and any(final.iterdir()):
            raise ValueError(f"{final} exists and is not a prepared folder: give a new --output_dir.")
        for stale in final.parent.glob(f".{final.name}.tmp-*"):  # a preparation killed midway: never trusted
            shutil.rmtree(stale, ignore_errors=True)
        staging = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            manifest = {**inputs, "key": key, **_build(source, staging, workers or default_workers(), quiet)}
            manifest["vocabulary"] = {**inputs["vocabulary"], "size": manifest.pop("vocabulary_size")}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # written last: the folder is whole
            if final.exists():
                final.rmdir()
            os.replace(staging, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        prepared = PreparedData(final, reused=False)
        # said by every process that built one, so that a DDP run shows it was built once
        say(f"data: prepared into {final} in {manifest['seconds']['total']:.0f} s: {prepared.describe()}")
        return prepared
    finally:
        lock.release()


def _build(source: Source, folder: Path, workers: int, quiet: bool) -> dict:
    """Read, learn the vocabulary and tokenize into `folder`; returns the counts and timings for the manifest."""
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 1)

    splits = source.splits()
    counts = {split: _read_text(source, split, folder / "splits" / split / "text.arrow", quiet) for split in splits}
    seconds = {"reading": lap()}
    tokenizer = _vocabulary(source, folder / "splits" / source.train_split / "text.arrow", quiet)
    tokenizer.save_pretrained(folder / "tokenizer")
    seconds["vocabulary"] = lap()
    for split in splits:
        limit = source.max_length if split == source.train_split else None  # test sets are never filtered
        kept = _tokenize(tokenizer, folder / "splits" / split, limit, workers, quiet, split)
        counts[split].update(pairs=kept, dropped_too_long=counts[split]["read"] - counts[split]["dropped_empty"] - kept)
        if split == source.train_split:
            check_filtered(counts[split], source.max_length)
    # what `prepare` adds to the key's inputs in the manifest
    return {"data": source.data, "hub": source.hub, "vocabulary_size": len(tokenizer), "splits": counts,
            "workers": workers,
            "seconds": {**seconds, "tokenizing": lap(), "total": round(clock[-1] - clock[0], 1)},
            "dropped": "pairs with an empty side (every split); training pairs with more than max_length tokens "
                       "on a side"}  # fmt: skip


def _read_text(source: Source, split: str, path: Path, quiet: bool) -> dict:
    """Stream a split into an Arrow file (`source`, `target`, `line`), dropping and counting empty pairs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = split_chunks(source.data, split, source.src, source.tgt, source.config, source.hub)
    cleaner = EmptyPairs(f"{source.data} {split}")
    bar = tqdm(desc=f"reading {split}", unit=" pairs", disable=quiet, unit_scale=True)
    writer = None
    with bar:
        for table in chunks:
            kept = cleaner(table)
            writer = writer or pa.ipc.new_stream(str(path), kept.schema)
            writer.write_table(kept)
            bar.update(len(table))
    if writer is None:
        raise ValueError(f"{source.data} {split} holds no non-empty sentence pairs.")
    writer.close()
    cleaner.finish()
    return {"read": cleaner.seen, "dropped_empty": cleaner.dropped}


def _text_table(path: Path) -> pa.Table:
    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def _vocabulary(source: Source, train_text: Path, quiet: bool) -> PreTrainedTokenizerFast:
    """`--tokenizer`, or the shared BPE trained on the training split (a sample of `bpe_sample_lines` pairs)."""
    if source.tokenizer:
        return load_tokenizer(source.tokenizer)
    rows = len(_text_table(train_text))
    sample = source.bpe_sample_lines if source.bpe_sample_lines and source.bpe_sample_lines < rows else None
    # a fixed random sample: corpora are often ordered by origin, so the first lines would be a biased one
    chosen = np.sort(np.random.default_rng(0).choice(rows, sample, replace=False)) if sample else None
    total = sample or rows
    say(f"data: training the shared BPE vocabulary ({source.vocab_size:,} entries) on {total:,} pairs", quiet)
    start = time.perf_counter()
    bar = tqdm(total=total, desc="BPE: counting words", unit=" pairs", disable=quiet, unit_scale=True)

    def texts() -> Iterator[list[str]]:
        # read from the file a batch at a time, not memory-mapped: the text's pages are not kept resident
        offset = 0
        for batch in pa.ipc.open_stream(pa.OSFile(str(train_text))):
            if chosen is not None:
                picked = chosen[np.searchsorted(chosen, offset) : np.searchsorted(chosen, offset + len(batch))]
                offset, batch = offset + len(batch), batch.take(pa.array(picked - offset))
            for first in range(0, len(batch), BATCH_ROWS):
                part = batch.slice(first, BATCH_ROWS)
                sources, targets = part.column(0).to_pylist(), part.column(1).to_pylist()
                yield [text for pair in zip(sources, targets, strict=True) for text in pair]  # the order of train()
                bar.update(len(sources))

    with bar:
        tokenizer = train_shared_bpe(texts(), source.vocab_size, split_punctuation=source.split_punctuation)
    say(f"data: BPE vocabulary trained in {time.perf_counter() - start:.0f} s", quiet)
    return tokenizer


_WORKER_TOKENIZER: Tokenizer | None = None
_WORKER_WORDS: dict[str, list[int]] = {}  # a worker's word cache (`word_tokenizing`), for its tokenizer


def _start_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)
    _WORKER_WORDS.clear()


def _ids(tokenizer: Tokenizer | PreTrainedTokenizerBase, texts: list[str], target: bool) -> pa.ListArray:
    if isinstance(tokenizer, Tokenizer):
        ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts)]
    else:  # a slow (Python) tokenizer, which may spell targets its own way
        ids = tokenizer(text_target=texts)["input_ids"] if target else tokenizer(texts)["input_ids"]
    return pa.array(ids, pa.list_(pa.int32()))


def encode_table(tokenizer: Tokenizer | PreTrainedTokenizerBase, table: pa.Table, first_row: int,
                 max_length: int | None, words: dict[str, list[int]] | None = None) -> pa.Table:  # fmt: skip
    """Token columns for text rows `first_row...`: what `tokenizer(sources, text_target=targets)` gives, without
    the attention mask (all ones: the collator makes it), keeping pairs of at most `max_length` tokens a side.
    `words`: a word cache, to go through `word_tokenizing` (the same ids; only where `word_tokenizing.applies`)."""
    columns = {}
    for name, side in (("input_ids", "source"), ("labels", "target")):
        texts = table.column(side).combine_chunks()
        slow = partial(_ids, tokenizer, target=side == "target")
        by_words = words is not None
        columns[name] = (
            word_tokenizing.encode_texts(tokenizer, texts, slow, words) if by_words else slow(texts.to_pylist())
        )
        columns[f"{side}_length"] = pc.cast(pc.list_value_length(columns[name]), pa.int32())
    columns["pair"] = pa.array(np.arange(first_row, first_row + len(table)), pa.int64())
    tokens = pa.table(columns)
    if max_length:
        longest = pc.max_element_wise(tokens.column("source_length"), tokens.column("target_length"))
        tokens = tokens.filter(pc.less_equal(longest, max_length))
    return tokens


def _tokenize_shard(text_path: str, start: int, stop: int, out_path: str, max_length: int | None,
                    tokenizer: Tokenizer | None = None, words: dict | None = None) -> tuple[int, int]:  # fmt: skip
    tokenizer, words = tokenizer or _WORKER_TOKENIZER, _WORKER_WORDS if words is None else words
    words = words if word_tokenizing.applies(tokenizer) else None
    table = _text_table(Path(text_path)).slice(start, stop - start)
    step = len(table) if words is not None else BATCH_ROWS  # by words, a whole shard at once: its words repeat more
    writer, kept = None, 0
    for offset in range(0, len(table), step):
        tokens = encode_table(tokenizer, table.slice(offset, step), start + offset, max_length, words)
        writer = writer or pa.ipc.new_stream(out_path, tokens.schema)
        writer.write_table(tokens)
        kept += len(tokens)
    writer.close()
    return stop - start, kept


def _tokenize(tokenizer: PreTrainedTokenizerFast, folder: Path, max_length: int | None, workers: int, quiet: bool,
              split: str) -> int:  # fmt: skip
    """Tokenize `folder/text.arrow` into `tokens-NNNNN.arrow` shards, in `workers` processes when there is more
    than one shard; returns the pairs kept."""
    rows = len(_text_table(folder / "text.arrow"))
    shards = [(start, min(start + SHARD_ROWS, rows)) for start in range(0, rows, SHARD_ROWS)]
    tasks = [(str(folder / "text.arrow"), start, stop, str(folder / f"tokens-{i:05d}.arrow"), max_length)
             for i, (start, stop) in enumerate(shards)]  # fmt: skip
    kept = 0
    with tqdm(total=rows, desc=f"tokenizing {split}", unit=" pairs", disable=quiet, unit_scale=True) as bar:
        if workers <= 1 or len(tasks) <= 1:
            words = {}
            for task in tasks:
                done, count = _tokenize_shard(*task, tokenizer=tokenizer.backend_tokenizer, words=words)
                bar.update(done)
                kept += count
            return kept
        # fork where there is one: a worker then needs no import of torch or transformers
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=_start_worker,
                                 initargs=(tokenizer.backend_tokenizer.to_str(),)) as pool:  # fmt: skip
            for done, count in pool.map(_tokenize_shard, *zip(*tasks, strict=True)):
                bar.update(done)
                kept += count
    return kept


def clear_cache() -> tuple[Path, int]:
    """Delete every preparation in the cache; returns the cache folder and the bytes freed."""
    folder = cache_dir()
    if not folder.is_dir():
        return folder, 0
    freed = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    shutil.rmtree(folder)
    return folder, freed
