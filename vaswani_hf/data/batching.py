"""Token-budget batching (section 5.1): batches of sentence pairs of similar length, each holding about N source and
N target tokens, instead of a fixed number of sentences."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import datasets
import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import Dataset, Sampler
from transformers.models.bart.modeling_bart import shift_tokens_right


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Section 5.1: pairs sorted by length and packed so that every batch's *padded* size stays within `max_tokens`
    on each side (`batch size x longest source <= max_tokens`, and the same for targets).

    Each epoch shuffles pairs of equal length among themselves and shuffles the order of the batches, from
    `seed + epoch` only, so a run resumed at any step sees the same batches in the same order. The batch
    boundaries depend only on the sorted lengths, so `len()` is the same every epoch. Under DDP, Accelerate's
    `BatchSamplerShard` deals the batches round-robin to the processes; this sampler knows nothing of ranks.

    With `buckets` (padded lengths, `training_speed.compile_buckets`) a batch holds pairs of one bucket only, at most
    `max_tokens // bucket` of them, so `training_speed.BucketPadding` can pad every batch to one of a few shapes
    (compiled training).
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        seed: int = 0,
        shuffle: bool = True,
        buckets: Sequence[int] | None = None,
    ) -> None:
        # int32, not int64: at 36M pairs every copy of a length array is 144 MB, not 288
        self.source_lengths = np.asarray(source_lengths).astype(np.int32, copy=False)
        self.target_lengths = np.asarray(target_lengths).astype(np.int32, copy=False)
        if self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"{len(self.source_lengths)} source lengths but {len(self.target_lengths)} target lengths."
            )
        if len(self.source_lengths) == 0:
            raise ValueError("The training set is empty: nothing to batch.")
        self.longest = np.maximum(self.source_lengths, self.target_lengths)
        too_long = int((self.longest > max_tokens).sum())
        if too_long:
            raise ValueError(
                f"{too_long} training pairs are longer than --max_tokens={max_tokens} tokens on one side and fit in "
                "no batch: raise --max_tokens or lower --max_length."
            )
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.order, self.ties = self._sort()
        sorted_lengths = self.longest[self.order]
        # kept: the order, the ties and the batch bounds; the lengths are not needed again (memory at 36M pairs)
        del self.longest, self.source_lengths, self.target_lengths
        if buckets is not None and int(sorted_lengths[-1]) > max(buckets):
            raise ValueError(f"the longest training pair has {int(sorted_lengths[-1])} tokens, more than the longest "
                             f"bucket ({max(buckets)}): give buckets up to the longest pair.")  # fmt: skip
        self.buckets = sorted(buckets) if buckets is not None else None
        self.bounds = self._pack(sorted_lengths, max_tokens, self.buckets)

    @staticmethod
    def _pack(sorted_lengths: np.ndarray, max_tokens: int, buckets: list[int] | None) -> list[tuple[int, int]]:
        # Lengths are ascending, so the last pair added is the longest: a batch [start, end) is full when
        # (end - start) x its last length (its bucket's, with buckets) exceeds the budget. Within a run of equal
        # (padded) lengths every batch but the first and the last holds exactly max_tokens // length pairs, so the
        # loop is over runs (a few hundred), never over pairs or batches: a second for WMT14 en-fr's 36M pairs.
        # Without buckets a batch left open at a run's end goes on into the next run; with them it ends there.
        padded = sorted_lengths if buckets is None else np.asarray(buckets)[np.searchsorted(buckets, sorted_lengths)]
        padded = np.asarray(padded)
        run_starts = np.flatnonzero(np.diff(padded)) + 1
        starts, ends = [], []
        start = 0  # the open batch: [start, run's first pair)
        for first, last in zip([0, *run_starts.tolist()], [*run_starts.tolist(), len(padded)], strict=True):
            capacity = max(max_tokens // max(int(padded[first]), 1), 1)
            if start < first:
                end = start + capacity
                if buckets is not None or end <= first:  # it takes none of this run
                    end = first
                elif end >= last:  # it takes all of this run, and stays open
                    continue
                starts.append(start), ends.append(end)
                start = end
            full = (last - start) // capacity  # batches of exactly `capacity` pairs
            starts.append(start + capacity * np.arange(full)), ends.append(start + capacity * np.arange(1, full + 1))
            start += capacity * full
        if start < len(padded):
            starts.append(start), ends.append(len(padded))
        starts, ends = (np.concatenate([np.atleast_1d(x) for x in side]) for side in (starts, ends))
        return list(zip(starts.tolist(), ends.tolist(), strict=True))

    def _sort(self) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Indices sorted by (longer side, source, target), ties by index, and the [start, end) of each run of
        equal lengths. One counting pass: each pair's (source, target) lengths get the rank of their group, and a
        stable sort by a 16-bit rank is a radix sort in numpy (seconds at WMT14 en-fr's 36M pairs, where np.lexsort
        of the three keys took tens of seconds)."""
        width = int(max(self.source_lengths.max(), self.target_lengths.max())) + 1
        pair = self.source_lengths.astype(np.int64 if width * width >= 1 << 31 else np.int32) * width
        pair += self.target_lengths
        table = width * width <= 1 << 24  # a table indexed by the pair, else np.unique
        if table:
            present = np.flatnonzero(np.bincount(pair, minlength=width * width))
        else:
            present, inverse = np.unique(pair, return_inverse=True)
        sources, targets = np.divmod(present, width)
        rank = np.empty(len(present), np.uint16 if len(present) <= 1 << 16 else np.int64)
        rank[np.lexsort((targets, sources, np.maximum(sources, targets)))] = np.arange(len(present))
        if table:
            lookup = np.zeros(width * width, rank.dtype)
            lookup[present] = rank
            ranks = lookup[pair]
        else:
            ranks = rank[inverse]
        order = np.argsort(ranks, kind="stable").astype(np.int32 if len(ranks) < 1 << 31 else np.int64)
        ends = np.cumsum(np.bincount(ranks, minlength=len(present)))
        ties = [(int(e - c), int(e)) for e, c in zip(ends, np.diff(ends, prepend=0), strict=True) if c > 1]
        return order, ties

    def _length_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (longer side, source, target), ties in random order when `rng` is given."""
        if rng is None:
            return self.order
        order = self.order.copy()
        for start, end in self.ties:  # a few thousand groups of equal lengths, each shuffled in place
            rng.shuffle(order[start:end])
        return order

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.bounds)

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng([self.seed, self.epoch]) if self.shuffle else None
        order = self._length_order(rng)
        batch_order = rng.permutation(len(self.bounds)) if rng is not None else range(len(self.bounds))
        for b in batch_order:
            start, end = self.bounds[b]
            yield order[start:end].tolist()


class BatchRows(Dataset):
    """A tokenized `datasets.Dataset` read a whole batch at a time: `__getitems__` (which a DataLoader with a batch
    sampler calls once per batch) gathers the batch's rows from the memory-mapped Arrow table in one call and returns
    them as an Arrow table, for `PadPairs`. No Python object is made per row or token (DataCollatorForSeq2Seq's
    path makes one list per row and pads in Python: at the paper's batch, about 900 pairs, 5x the host time)."""

    def __init__(self, dataset: datasets.Dataset) -> None:
        missing = {"input_ids", "labels"} - set(dataset.column_names)
        if missing:
            raise ValueError(f"BatchRows reads tokenized pairs, but the dataset has no {', '.join(sorted(missing))} "
                             f"column (it has {', '.join(dataset.column_names)}).")  # fmt: skip
        self.rows = dataset.select_columns(["input_ids", "labels"]).with_format("arrow")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: list[int]) -> pa.Table:
        return self.rows[indices]


@dataclass(frozen=True)
class PadPairs:
    """The tensors `DataCollatorForSeq2Seq(tokenizer, model=model)` makes of a batch of pairs, made in numpy from the
    Arrow table `BatchRows` reads: `input_ids` padded with `pad_token_id` and its `attention_mask`, `labels` padded
    with -100, and `decoder_input_ids`, the labels shifted right behind `decoder_start_token_id` (teacher forcing,
    -100 read as padding). tests/test_recipe.py checks the two give equal tensors."""

    pad_token_id: int
    decoder_start_token_id: int
    pad_to_multiple_of: int = 1  # 8 on a GPU: a few shapes, not one per longest pair
    vocab_size: int | None = None  # given: ids are checked here, on the host, so the model need not read them back

    def __call__(self, rows: pa.Table) -> dict[str, torch.Tensor]:
        input_ids, source_lengths = self._pad(rows.column("input_ids"), self.pad_token_id, self.pad_to_multiple_of,
                                              self.vocab_size, "input_ids")  # fmt: skip
        labels = torch.from_numpy(self._pad(rows.column("labels"), -100, self.pad_to_multiple_of, self.vocab_size,
                                            "labels")[0])  # fmt: skip
        attention_mask = (np.arange(input_ids.shape[1]) < source_lengths[:, None]).astype(np.int64)
        # the model's own teacher-forcing shift (`prepare_decoder_input_ids_from_labels`)
        decoder_input_ids = shift_tokens_right(labels, self.pad_token_id, self.decoder_start_token_id)
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
                "labels": labels, "decoder_input_ids": decoder_input_ids}  # fmt: skip

    @staticmethod
    def _pad(column: pa.ChunkedArray, fill: int, multiple: int = 1, vocab_size: int | None = None,
             name: str = "") -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """A list column as a (rows, longest rounded up to `multiple`) int64 array filled with `fill` past each
        row's end, and the lengths. With `vocab_size`, an id outside [0, vocab_size) is an error naming `name`."""
        column = column.combine_chunks()
        offsets = column.offsets.to_numpy()
        lengths = np.diff(offsets)
        values = column.values.to_numpy()[offsets[0] : offsets[-1]]
        if vocab_size is not None and len(values):
            check_ids(int(values.min()), int(values.max()), vocab_size, name)
        width = -(-int(lengths.max(initial=0)) // multiple) * multiple
        padded = np.full((len(lengths), width), fill, dtype=np.int64)
        padded[np.arange(padded.shape[1]) < lengths[:, None]] = values
        return padded, lengths


def check_ids(low: int, high: int, vocab_size: int, name: str) -> None:
    """A training batch's `name` ids, whose smallest is `low` and largest `high`, inside [0, vocab_size)."""
    if low < 0 or high >= vocab_size:
        raise ValueError(f"the training set's {name} hold token id {high if high >= vocab_size else low}, outside "
                         f"the model's vocabulary [0, {vocab_size}): the data was tokenized with another vocabulary; "
                         "prepare it again with this model's tokenizer.")  # fmt: skip


@dataclass(frozen=True)
class CheckedOnTheHost:
    """Any collator, its batches' ids checked here, on the host, as `PadPairs` checks its own: the model's check
    would read a device value back at every training step (on a GPU, a wait for the card)."""

    collator: object
    vocab_size: int

    def __call__(self, rows) -> dict:
        batch = self.collator(rows)
        for name in ("input_ids", "decoder_input_ids", "labels"):
            ids = batch.get(name)
            if isinstance(ids, torch.Tensor) and ids.device.type == "cpu":
                ids = ids[ids != -100] if name == "labels" else ids
                if ids.numel():
                    check_ids(*torch.stack(torch.aminmax(ids)).tolist(), self.vocab_size, name)
        return batch
