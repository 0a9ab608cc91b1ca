"""Section 5.1's data at the paper's scale, prepared once: the training text read, the shared BPE vocabulary learned,
every pair tokenized into the prepared format (`prepared`) that training runs memory-map.

`prepare()` finds or builds the preparation a request names (`prepared_cache`: key, lock, staging folder), then
the evaluation splits asked for, each on its own. Building the training split:

1. read: the split streamed into a temporary Arrow file a chunk at a time, pairs with an empty side dropped and
   counted;
2. vocabulary: `--tokenizer`, or the shared BPE learned from a fixed random sample of the pairs
   (`bpe_sample_lines`, one million by default, as Marian and SentencePiece sample) in a child process, so its
   memory is returned before the tokenizing workers are forked;
3. tokenize: worker processes write `tokens-NNNNN.arrow` shards, dropping pairs longer than `max_length`; then
   the temporary text is deleted.

An evaluation split keeps every pair, an empty side included (a test set is scored whole), and its text.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from . import word_tokenizing
from .prepared import MANIFEST, SPLIT_FILE, PreparedData, check_filtered, encode_table
from .prepared_cache import (
    PreparationRequest,
    cache_dir,
    check_free_space,
    load_tokenizer,
    locked,
    staging_folder,
    tokenizer_hash,
)
from .readers import DropEmptyPairs, split_chunks
from .tokenization import train_shared_bpe

SHARD_ROWS = 100_000  # rows a tokenizing task takes: small enough for a steady progress bar
BATCH_ROWS = 10_000  # rows tokenized in one call
DEFAULT_BPE_SAMPLE = 1_000_000  # pairs the BPE learns from by default (docs/decisions.md)
# disk a preparation needs while it runs, per byte of training text: the temporary Arrow text (about 1.0) and the
# token shards (0.5 to 0.6 at 32,000-37,000 entries, uint16)
DISK_PER_TEXT_BYTE = 1.7
GZIP_RATIO = 4  # text bytes per byte of a gzipped file, to check the free space


def default_workers() -> int:
    """Tokenizing processes: one per core this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def say(message: str, quiet: bool = False) -> None:
    """A progress line on stderr (the summary goes to stdout)."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


def _fork_context() -> multiprocessing.context.BaseContext:
    # fork where there is one: a child then needs no import of torch or transformers
    return multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)


def prepare(request: PreparationRequest, output_dir: str | Path | None = None, workers: int | None = None,
            quiet: bool = False, eval_splits: Sequence[str] = ()) -> PreparedData:  # fmt: skip
    """The prepared data for `request`, with `eval_splits`: in `output_dir`, or in the cache under the request's
    key when none is given. What is there with the same key is reused; the rest is built under the lock."""
    key, inputs = request.key()
    final = Path(output_dir) if output_dir is not None else cache_dir() / key
    try:
        return _prepare(request, key, inputs, final, output_dir is not None, workers, quiet, eval_splits)
    except OSError as err:
        said = _writing_error(err, final, output_dir is not None)
        if said is None:
            raise
        raise said from None


def _writing_error(err: OSError, final: Path, given: bool) -> OSError | None:
    """A read-only folder or a full disk, said with the path and the fix (the system's message names neither the
    folder nor what to do, and Arrow's names no path); None for any other error, which is raised as it is."""
    where = "--output_dir DIR" if given else "VASWANI_PREPARED_CACHE=DIR"
    # no such file, for the lock file in a folder that is there: the folder takes no new files (as /proc)
    no_lock = err.errno == errno.ENOENT and err.filename is not None and os.path.isdir(os.path.dirname(err.filename))
    no_lock = no_lock and Path(err.filename).name == f".{final.name}.lock"
    if (err.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and err.filename is not None) or no_lock:
        path = Path(os.path.abspath(err.filename))
        final = Path(os.path.abspath(final))
        ours = (
            path == final
            or final in path.parents
            or path in final.parents
            or (path.parent == final.parent and path.name.startswith(f".{final.name}."))
        )  # its lock and staging folders
        if ours:
            folder = path.parent if no_lock else path if path in final.parents else final.parent
            reason = "it takes no new files" if no_lock else err.strerror
            return OSError(f"cannot write in {folder} ({reason}): prepare into a folder you can write to ({where}).")
    if err.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(err):
        return OSError(f"the disk holding {final.parent} is full (No space left on device, while preparing "
                       f"{final}; what was written is removed): free some space, or prepare on another disk "
                       f"({where}).")  # fmt: skip
    return None


def _prepare(request: PreparationRequest, key: str, inputs: dict, final: Path, given: bool, workers: int | None,
             quiet: bool, eval_splits: Sequence[str]) -> PreparedData:  # fmt: skip
    built = False
    with locked(final, lambda message: say(message, quiet)):
        if PreparedData.is_prepared(final):
            found = PreparedData(final)
            if found.manifest.get("key") != key:
                if not given:
                    raise RuntimeError(f"{final} holds a preparation with another key: clear the cache.")
                raise ValueError(f"{final} holds data prepared from other files or options: give another "
                                 "--output_dir, or delete it.")  # fmt: skip
        elif final.exists() and any(final.iterdir()):
            raise ValueError(f"{final} exists and is not a prepared folder: give a new --output_dir.")
        else:
            _build_training(request, inputs, key, final, workers or default_workers(), quiet)
            built = True
        manifest = json.loads((final / MANIFEST).read_text())
        for split in dict.fromkeys(eval_splits):
            if split != request.train_split:
                _prepare_split(request, final, split, manifest["vocabulary"]["sha256"], quiet)
    prepared = PreparedData(final, reused=not built)
    if built:  # said by every process that built one, so that a DDP run shows it was built once
        say(f"data: prepared into {final} in {manifest['seconds']['total']:.0f} s: {prepared.describe()}")
    else:
        say(f"data: reused the prepared data in {final}: {prepared.describe()}", quiet)
    return prepared


def _build_training(request: PreparationRequest, inputs: dict, key: str, final: Path, workers: int,
                    quiet: bool) -> None:  # fmt: skip
    """Read, learn the vocabulary and tokenize the training split in a staging folder, then move it into place."""
    # a gzipped file holds about 3 to 4 times its size of text
    text_bytes = sum(f.get("size", 0) * (GZIP_RATIO if f.get("path", "").endswith(".gz") else 1)
                     for f in inputs["files"])  # fmt: skip
    check_free_space(final.parent, int(text_bytes * DISK_PER_TEXT_BYTE), f"{request.data} {request.train_split}")
    staging = staging_folder(final)
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 1)

    try:
        folder = staging / "splits" / request.train_split
        text = folder / "text.arrow"
        counts = _read_text(request, request.train_split, text, keep_empty=False, quiet=quiet)
        seconds = {"reading": lap()}
        tokenizer = _vocabulary(request, text, staging / "tokenizer", quiet)
        seconds["vocabulary"] = lap()
        kept = _tokenize(tokenizer, folder, request.max_length, workers, quiet, request.train_split)
        text.unlink()  # the training text is not kept (`prepared`)
        counts.update(pairs=kept, dropped_too_long=counts["read"] - counts["dropped_empty"] - kept)
        check_filtered(counts, request.max_length)
        manifest = {**inputs, "key": key, "data": request.data, "hub": request.hub, "counts": counts,
                    "vocabulary": {**inputs["vocabulary"], "size": len(tokenizer),
                                   "sha256": tokenizer_hash(tokenizer)},
                    "workers": workers,
                    "seconds": {**seconds, "tokenizing": lap(), "total": round(clock[-1] - clock[0], 1)},
                    "dropped": "training pairs with an empty side or more than max_length tokens on a side; "
                               "evaluation splits keep every pair"}  # fmt: skip
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # written last: the folder is whole
        if final.exists():
            final.rmdir()
        os.replace(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prepare_split(request: PreparationRequest, final: Path, split: str, tokenizer_sha256: str, quiet: bool) -> None:
    """An evaluation split, prepared on its own unless it is there with the same key: every pair kept, its text
    beside its tokens."""
    key, inputs = request.split_key(split, tokenizer_sha256)
    folder = final / "splits" / split
    for killed in folder.parent.glob(f".{split}.tmp-*"):  # we hold the preparation's lock: no one builds these
        shutil.rmtree(killed, ignore_errors=True)
    if (folder / SPLIT_FILE).is_file() and json.loads((folder / SPLIT_FILE).read_text()).get("key") == key:
        return
    staging = staging_folder(folder)
    try:
        counts = _read_text(request, split, staging / "text.arrow", keep_empty=True, quiet=quiet)
        tokenizer = AutoTokenizer.from_pretrained(final / "tokenizer")
        counts.update(pairs=_tokenize(tokenizer, staging, None, 1, quiet, split), dropped_too_long=0)
        (staging / SPLIT_FILE).write_text(json.dumps({**inputs, "key": key, "counts": counts}, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)  # this split's files changed: it alone is prepared again
        os.replace(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _read_text(request: PreparationRequest, split: str, path: Path, keep_empty: bool, quiet: bool) -> dict:
    """Stream a split into an Arrow file (`source`, `target`, `line`); pairs with an empty side are dropped and
    counted unless `keep_empty`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = split_chunks(request.data, split, request.src, request.tgt, request.config, request.hub)
    cleaner = DropEmptyPairs(f"{request.data} {split}", keep_empty)
    bar = tqdm(desc=f"reading {split}", unit=" pairs", disable=quiet, unit_scale=True)
    writer = None
    with bar:
        for table in chunks:
            kept = cleaner(table)
            writer = writer or pa.ipc.new_stream(str(path), kept.schema)
            writer.write_table(kept)
            bar.update(len(table))
    if writer is None:
        raise ValueError(f"{request.data} {split} holds no sentence pairs.")
    writer.close()
    cleaner.finish()
    return {"read": cleaner.seen, "dropped_empty": cleaner.dropped}


def _text_table(path: Path) -> pa.Table:
    return pa.ipc.open_stream(pa.memory_map(str(path))).read_all()


def _vocabulary(request: PreparationRequest, train_text: Path, folder: Path, quiet: bool) -> PreTrainedTokenizerFast:
    """`--tokenizer`, or the shared BPE learned in a child process (its memory, which grows with the sample's word
    types, goes back to the system before the tokenizing workers are forked from this one); saved in `folder`."""
    if request.tokenizer:
        tokenizer = load_tokenizer(request.tokenizer)
        tokenizer.save_pretrained(folder)
        return tokenizer
    with ProcessPoolExecutor(1, mp_context=_fork_context()) as child:
        try:
            child.submit(_learn_bpe, request, str(train_text), str(folder), quiet).result()
        except BrokenProcessPool:
            raise MemoryError(f"the process learning the BPE vocabulary was killed (out of memory?): "
                              f"{_longest_line(request, train_text)}; its memory grows with the longest line and "
                              "with the sample: remove or split lines that long (one sentence a line), or give "
                              "--bpe_sample_lines a smaller sample.") from None  # fmt: skip
    return AutoTokenizer.from_pretrained(folder)


def _longest_line(request: PreparationRequest, train_text: Path) -> str:
    """The training split's longest side, said with its line and size: what a killed BPE learner most likely
    choked on (a single line of tens of MB holds gigabytes as the learner's words and pieces)."""
    longest = (0, 0, "")
    for batch in pa.ipc.open_stream(pa.OSFile(str(train_text))):
        for side in ("source", "target"):
            lengths = pc.binary_length(batch.column(side))
            if len(lengths) and (size := pc.max(lengths).as_py()) > longest[0]:
                longest = (size, batch.column("line")[pc.index(lengths, size).as_py()].as_py(), side)
    language = request.src if longest[2] == "source" else request.tgt
    return (
        f"the longest training line is line {longest[1]:,} of {request.data} {request.train_split} "
        f"({language}), {longest[0] / 1e6:,.1f} MB"
    )


def _learn_bpe(request: PreparationRequest, train_text: str, folder: str, quiet: bool) -> None:
    """The shared BPE learned from a fixed random sample of `bpe_sample_lines` training pairs (all of them when
    None or when the split is smaller), saved in `folder`."""
    with pa.ipc.open_stream(pa.memory_map(train_text)) as reader:
        rows = sum(batch.num_rows for batch in reader)
    sample = request.bpe_sample_lines if request.bpe_sample_lines and request.bpe_sample_lines < rows else None
    # a fixed random sample: corpora are often ordered by origin, so the first lines would be a biased one
    chosen = np.sort(np.random.default_rng(0).choice(rows, sample, replace=False)) if sample else None
    total = sample or rows
    say(f"data: learning the shared BPE vocabulary ({request.vocab_size:,} entries) from {total:,} of {rows:,} "
        "pairs", quiet)  # fmt: skip
    start = time.perf_counter()
    bar = tqdm(total=total, desc="BPE: counting words", unit=" pairs", disable=quiet, unit_scale=True)

    def texts() -> Iterator[list[str]]:
        # read from the file a batch at a time, not memory-mapped: the text's pages are not kept resident
        offset = 0
        for batch in pa.ipc.open_stream(pa.OSFile(train_text)):
            if chosen is not None:
                picked = chosen[np.searchsorted(chosen, offset) : np.searchsorted(chosen, offset + len(batch))]
                offset, batch = offset + len(batch), batch.take(pa.array(picked - offset))
            for first in range(0, len(batch), BATCH_ROWS):
                part = batch.slice(first, BATCH_ROWS)
                sources, targets = part.column(0).to_pylist(), part.column(1).to_pylist()
                if request.whole_target_words:  # the BPE is the words'; the target's symbols are entries whole
                    yield sources
                else:
                    yield [text for pair in zip(sources, targets, strict=True) for text in pair]  # train()'s order
                bar.update(len(sources))

    whole = target_words(train_text) if request.whole_target_words else ()
    with bar:
        tokenizer = train_shared_bpe(texts(), request.vocab_size, split_punctuation=request.split_punctuation,
                                     whole_words=whole)  # fmt: skip
    tokenizer.save_pretrained(folder)
    say(f"data: BPE vocabulary learned in {time.perf_counter() - start:.0f} s", quiet)


def target_words(train_text: str) -> set[str]:
    """Every distinct space-separated word of the training targets, counted in Arrow a batch at a time."""
    words: set[str] = set()
    for batch in pa.ipc.open_stream(pa.OSFile(train_text)):
        words.update(pc.unique(pc.list_flatten(pc.utf8_split_whitespace(batch.column(1)))).to_pylist())
    return words


_WORKER_TOKENIZER: Tokenizer | None = None
_WORKER_WORDS: dict[str, list[int]] = {}  # a worker's word cache (`word_tokenizing`), for its tokenizer


def _start_worker(tokenizer_json: str) -> None:
    global _WORKER_TOKENIZER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    _WORKER_TOKENIZER = Tokenizer.from_str(tokenizer_json)
    _WORKER_WORDS.clear()


def _tokenize_shard(text_path: str, start: int, stop: int, out_path: str, max_length: int | None,
                    tokenizer: Tokenizer | None = None, words: dict | None = None) -> tuple[int, int]:  # fmt: skip
    tokenizer, words = tokenizer or _WORKER_TOKENIZER, _WORKER_WORDS if words is None else words
    words = words if word_tokenizing.applies(tokenizer) else None
    table = _text_table(Path(text_path)).slice(start, stop - start)
    step = len(table) if words is not None else BATCH_ROWS  # by words, a whole shard at once: its words repeat more
    writer, kept = None, 0
    for offset in range(0, len(table), step):
        tokens, _ = encode_table(tokenizer, table.slice(offset, step), max_length, words)
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
        with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=_fork_context(), initializer=_start_worker,
                                 initargs=(tokenizer.backend_tokenizer.to_str(),)) as pool:  # fmt: skip
            for done, count in pool.map(_tokenize_shard, *zip(*tasks, strict=True)):
                bar.update(done)
                kept += count
    return kept
