"""Token-budget batching (section 5.1): batches of sentence pairs of similar length, each holding about N source and
N target tokens, instead of a fixed number of sentences."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Section 5.1: pairs sorted by length and packed so that every batch's *padded* size stays within `max_tokens`
    on each side (`batch size x longest source <= max_tokens`, and the same for targets).

    Each epoch shuffles pairs of equal length among themselves and shuffles the order of the batches, from
    `seed + epoch` only, so a run resumed at any step sees the same batches in the same order. The batch
    boundaries depend only on the sorted lengths, so `len()` is the same every epoch. Under DDP, Accelerate's
    `BatchSamplerShard` deals the batches round-robin to the processes; this sampler knows nothing of ranks.

    With `buckets` (padded lengths, `training_speed.length_buckets`) a batch holds pairs of one bucket only, at most
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
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"{len(self.source_lengths)} source lengths but {len(self.target_lengths)} target lengths."
            )
        if len(self.source_lengths) == 0:
            raise ValueError("The training set is empty: nothing to batch.")
        too_long = int((np.maximum(self.source_lengths, self.target_lengths) > max_tokens).sum())
        if too_long:
            raise ValueError(
                f"{too_long} training pairs are longer than --max_tokens={max_tokens} tokens on one side and fit in "
                "no batch: raise --max_tokens or lower --max_length."
            )
        self.max_tokens = max_tokens
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        sorted_lengths = np.maximum(self.source_lengths, self.target_lengths)[self._length_order(None)]
        if buckets is not None and int(sorted_lengths[-1]) > max(buckets):
            raise ValueError(f"the longest training pair has {int(sorted_lengths[-1])} tokens, more than the longest "
                             f"bucket ({max(buckets)}): give buckets up to the longest pair.")  # fmt: skip
        self.buckets = sorted(buckets) if buckets is not None else None
        self.bounds = self._pack(sorted_lengths, max_tokens, self.buckets)

    @staticmethod
    def _pack(sorted_lengths: np.ndarray, max_tokens: int, buckets: list[int] | None) -> list[tuple[int, int]]:
        # Lengths are ascending, so the last pair added is the longest: a batch [start, end) is full when
        # (end - start) x its last length (its bucket's, with buckets; a new bucket starts a new batch) exceeds the
        # budget. One numpy search per batch, never a Python step per pair: tens of thousands of batches at WMT's
        # size against millions of pairs.
        padded = sorted_lengths if buckets is None else np.asarray(buckets)[np.searchsorted(buckets, sorted_lengths)]
        padded = np.asarray(padded, dtype=np.int64)
        # where each run of equal padded lengths ends: a batch never crosses a bucket's end
        run_end = np.append(np.flatnonzero(np.diff(padded)) + 1, len(padded)) if buckets is not None else None
        bounds, start, total = [], 0, len(padded)
        while start < total:
            limit = total if run_end is None else int(run_end[np.searchsorted(run_end, start, side="right")])
            window = padded[start : min(limit, start + max_tokens // max(int(padded[start]), 1) + 1)]
            fits = np.arange(1, len(window) + 1) * window <= max_tokens  # True, then False: both factors grow
            end = start + max(int(np.count_nonzero(fits)), 1)
            bounds.append((start, end))
            start = end
        return bounds

    def _length_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (longer side, source, target), ties in random order when `rng` is given."""
        candidates = np.arange(len(self.source_lengths)) if rng is None else rng.permutation(len(self.source_lengths))
        keys = (self.target_lengths, self.source_lengths, np.maximum(self.source_lengths, self.target_lengths))
        if keys[2].max() >= 1 << 16:
            return candidates[np.lexsort([key[candidates] for key in keys])]
        # np.lexsort's order, least significant key first, by stable sorts of 16-bit keys, which numpy does as radix
        # sorts: seconds at WMT14 en-fr's 36M pairs, where lexsort took tens of seconds.
        order = candidates
        for key in keys:
            order = order[np.argsort(key[order].astype(np.uint16), kind="stable")]
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
