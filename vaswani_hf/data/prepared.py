"""The prepared format: tokenized splits that training memory-maps, and the in-memory stand-in for small data.

A prepared folder:

    manifest.json                 the training split's key inputs, counts, timings; the vocabulary
    tokenizer/                    the shared BPE vocabulary (or the one given)
    splits/{train}/tokens-NNNNN.arrow
    splits/{eval}/split.json      an evaluation split's key inputs and counts
    splits/{eval}/text.arrow      its text: references are scored as written
    splits/{eval}/tokens-00000.arrow

Token shards hold two columns, `input_ids` and `labels` (each ending with </s>), as uint16 when the vocabulary
has fewer than 65,536 entries and int32 otherwise (as fairseq stores them); they read back as the same ids. A
pair's lengths are its lists' lengths, read from the Arrow offsets. The training text is not kept: the few
features that want it (BPE-dropout, the model card's example) decode it from the ids (`DecodedPairs`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, concatenate_datasets
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from . import word_tokenizing
from .prepared_cache import FORMAT, changed

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SPLIT_FILE = "split.json"


def id_type(vocabulary_size: int) -> pa.DataType:
    """The narrowest type that holds every id: uint16 below 65,536 entries."""
    return pa.uint16() if vocabulary_size <= 1 << 16 else pa.int32()


def _ids(tokenizer: Tokenizer | PreTrainedTokenizerBase, texts: list[str], target: bool) -> pa.ListArray:
    if isinstance(tokenizer, Tokenizer):
        ids = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts)]
    else:  # a slow (Python) tokenizer, which may spell targets its own way
        ids = tokenizer(text_target=texts)["input_ids"] if target else tokenizer(texts)["input_ids"]
    return pa.array(ids, pa.list_(pa.int32()))


def encode_table(tokenizer: Tokenizer | PreTrainedTokenizerBase, table: pa.Table, max_length: int | None,
                 words: dict[str, list[int]] | None = None) -> tuple[pa.Table, np.ndarray]:  # fmt: skip
    """The token columns of text rows: what `tokenizer(sources, text_target=targets)` gives, without the attention
    mask (all ones: the collator makes it), as `id_type`, keeping pairs of at most `max_length` tokens a side.
    Returns them and the rows kept. `words`: a word cache, to go through `word_tokenizing` (the same ids; only
    where `word_tokenizing.applies`)."""
    columns = {}
    for name, side in (("input_ids", "source"), ("labels", "target")):
        texts = table.column(side).combine_chunks()
        slow = partial(_ids, tokenizer, target=side == "target")
        by_words = words is not None
        columns[name] = (
            word_tokenizing.encode_texts(tokenizer, texts, slow, words) if by_words else slow(texts.to_pylist())
        )
    size = tokenizer.get_vocab_size() if isinstance(tokenizer, Tokenizer) else len(tokenizer)
    tokens = pa.table(columns).cast(pa.schema({name: pa.list_(id_type(size)) for name in columns}))
    kept = np.arange(len(table))
    if max_length:
        longest = np.maximum(*(list_lengths(tokens.column(name)) for name in columns))
        kept = np.flatnonzero(longest <= max_length)
        if len(kept) < len(table):
            tokens = tokens.take(kept)
    return tokens, kept


def list_lengths(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)


def token_lengths(dataset: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths of a tokens dataset, from the Arrow offsets (numpy, never a Python step per row),
    following what `select()` or `shuffle()` left."""
    lengths = [list_lengths(dataset.data.column(name)) for name in ("input_ids", "labels")]
    indices = dataset._indices
    if indices is not None:
        rows = indices.column(0).to_numpy()
        lengths = [values[rows] for values in lengths]
    return lengths[0], lengths[1]


def check_filtered(counts: dict, max_length: int | None) -> None:
    """Say how many training pairs `max_length` dropped; refuse a training set it emptied."""
    if counts["read"] - counts["dropped_empty"] and not counts["pairs"]:
        raise ValueError(f"every training pair is longer than --max_length={max_length} tokens: raise it.")
    if counts["dropped_too_long"]:
        logger.warning("dropped %d of %d training pairs longer than --max_length=%d tokens",
                       counts["dropped_too_long"], counts["read"], max_length)  # fmt: skip


class TextPairs(Sequence):
    """(source, target) texts of the given rows of a split's text."""

    def __init__(self, text: Dataset, rows: np.ndarray) -> None:
        self.table, self.rows = text.data.table, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[str, str]:
        row = int(self.rows[index])
        return self.table.column("source")[row].as_py(), self.table.column("target")[row].as_py()


class DecodedPairs(Sequence):
    """(source, target) texts of a split whose text is not kept, decoded from its ids. For the shared BPE
    (Metaspace, no normalizer) that is the text as read, but for a character the vocabulary lacks, which decodes
    as "<unk>" and encodes back to the same id."""

    def __init__(self, tokens: Dataset, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokens, self.tokenizer = tokens, tokenizer

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[str, str]:
        row = self.tokens[index]
        eos = self.tokenizer.eos_token_id
        return tuple(self.tokenizer.decode(ids[:-1] if ids and ids[-1] == eos else ids)
                     for ids in (row["input_ids"], row["labels"]))  # fmt: skip


class TokenizedData(Protocol):
    """What training reads: a prepared folder (`PreparedData`) or pairs tokenized in memory (`InMemoryData`)."""

    path: Path
    reused: bool
    train_split: str

    @property
    def splits(self) -> list[str]: ...
    def counts(self, split: str) -> dict: ...
    def tokenizer(self) -> PreTrainedTokenizerBase: ...
    def tokens(self, split: str) -> Dataset: ...
    def text(self, split: str) -> Dataset: ...
    def pairs(self, split: str) -> Sequence[tuple[str, str]]: ...
    def describe(self) -> str: ...


def _describe(counts: dict, max_length: int | None) -> str:
    return (f"{counts['pairs']:,} training pairs ({counts['dropped_empty']:,} dropped with an empty side, "
            f"{counts['dropped_too_long']:,} longer than {max_length} tokens)")  # fmt: skip


class PreparedData:
    """A prepared folder: its tokenizer, and each split's tokens (and an evaluation split's text) as memory-mapped
    `datasets.Dataset`s."""

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
        self.train_split = self.manifest["train_split"]
        self.split_manifests = {folder.name: json.loads((folder / SPLIT_FILE).read_text())
                                for folder in sorted((self.path / "splits").glob(f"*/{SPLIT_FILE}"))
                                for folder in [folder.parent] if not folder.name.startswith(".")}  # fmt: skip

    @staticmethod
    def is_prepared(path: str | Path | None) -> bool:
        return path is not None and (Path(path) / MANIFEST).is_file()

    @property
    def splits(self) -> list[str]:
        return [self.train_split, *self.split_manifests]

    def counts(self, split: str) -> dict:
        self._split_dir(split)
        return self.manifest["counts"] if split == self.train_split else self.split_manifests[split]["counts"]

    def tokenizer(self) -> PreTrainedTokenizerFast:
        return AutoTokenizer.from_pretrained(self.path / "tokenizer")

    def _split_dir(self, split: str) -> Path:
        if split not in self.splits:
            raise ValueError(f"{self.path} holds no split {split!r} (it has {', '.join(self.splits)}); prepare it "
                             f"with `vaswani prepare --data RAW --output_dir {self.path} --eval_splits "
                             f"{split}`.")  # fmt: skip
        return self.path / "splits" / split

    def text(self, split: str) -> Dataset:
        """An evaluation split's text (`source`, `target`, `line`), row for row with its tokens."""
        if split == self.train_split:
            raise ValueError(f"{self.path} keeps no copy of the training text: read `pairs({split!r})`.")
        return Dataset.from_file(str(self._split_dir(split) / "text.arrow"))

    def tokens(self, split: str) -> Dataset:
        shards = sorted(self._split_dir(split).glob("tokens-*.arrow"))
        return concatenate_datasets([Dataset.from_file(str(shard)) for shard in shards])

    def pairs(self, split: str) -> Sequence[tuple[str, str]]:
        if split == self.train_split:
            return DecodedPairs(self.tokens(split), self.tokenizer())
        text = self.text(split)
        return TextPairs(text, np.arange(len(text)))

    def stale_files(self) -> list[str]:
        """Source files that changed since they were prepared (or are gone)."""
        known = [*self.manifest["files"], *(f for m in self.split_manifests.values() for f in m["files"])]
        return [f["path"] for f in known if changed(f)]

    def describe(self) -> str:
        return _describe(self.manifest["counts"], self.manifest["max_length"])


class InMemoryData:
    """Pairs held in memory (the built-in task, a small fine-tuning set, the Python API), tokenized as `prepare`
    tokenizes, with the same splits, columns and counts."""

    def __init__(self, pairs: dict[str, Sequence[tuple[str, str]]], tokenizer: PreTrainedTokenizerBase,
                 train_split: str = "train", max_length: int | None = None) -> None:  # fmt: skip
        self.path, self.reused, self.train_split, self._tokenizer = Path("<memory>"), False, train_split, tokenizer
        self.max_length = max_length
        encoder = tokenizer.backend_tokenizer if tokenizer.is_fast else tokenizer
        self._text, self._tokens, self._kept, self._counts = {}, {}, {}, {}
        for split, rows in pairs.items():
            sources, targets = zip(*rows, strict=True) if rows else ((), ())
            text = pa.table({"source": pa.array(sources, pa.large_string()),
                             "target": pa.array(targets, pa.large_string()),
                             "line": pa.array(range(1, len(rows) + 1), pa.int64())})  # fmt: skip
            limit = max_length if split == train_split else None
            self._text[split] = Dataset(text)
            words = {} if word_tokenizing.applies(encoder) else None
            tokens, self._kept[split] = encode_table(encoder, text, limit, words)
            self._tokens[split] = Dataset(tokens)
            counts = {"read": len(rows), "dropped_empty": 0, "pairs": len(tokens)}
            self._counts[split] = {**counts, "dropped_too_long": len(rows) - len(tokens)}
        if train_split in self._counts:
            check_filtered(self._counts[train_split], max_length)

    @property
    def splits(self) -> list[str]:
        return list(self._counts)

    def counts(self, split: str) -> dict:
        return self._counts[split]

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def text(self, split: str) -> Dataset:
        return self._text[split]

    def tokens(self, split: str) -> Dataset:
        return self._tokens[split]

    def pairs(self, split: str) -> Sequence[tuple[str, str]]:
        return TextPairs(self._text[split], self._kept[split])

    def describe(self) -> str:
        return _describe(self._counts[self.train_split], self.max_length)
