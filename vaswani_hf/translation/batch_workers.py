# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""Independent batches decoded side by side on CPU, each on one thread: CTranslate2's `inter_threads`, for
`vaswani translate` (its light start too), `vaswani evaluate` and every caller of `translate_nbest` with more
than one batch.

Why: a decoding step of a CPU-sized model is dozens of operators of microseconds each. Spread over the process's
threads, each operator is a parallel region whose other threads must be woken (OpenMP's passive wait, which the
package sets so that a process beside a busy neighbour keeps its share, docs/engines-performance.md) and waited for;
between the operators, the search's Python runs on one core while the other idles. Two batches decoded at once, each
on one thread, have no parallel region at all, and one search's Python runs while the other's operators compute
(torch releases the GIL inside its kernels). Measured on 2 cores of an AMD EPYC (Zen 4), the `small` preset trained
on Multi30k, the first 1,000 lines of test2016 in batches of 32, in one process: greedy 171 -> 294 sentences/s, beam
4 81 -> 132; batches of one sentence (200 lines), beam 4 12.7 -> 20.9 (the model's greedy one-row steps keep one
batch at a time; the light start's do not) (docs/engines-performance.md). Beside a busy neighbour no thread of
ours waits for another.

What it does not change: each batch is the same search, on the same model, in the same batch; the outputs come back
in the batches' order. A batch's products then run on one thread instead of all, which may split a product's sums
another way: the same tokens, scores up to rounding, as the one-thread steps (`model/speed/step_threads.py`);
tests/test_batch_workers.py holds the searches to it over their space (Hypothesis). The fast products
(`model/speed/fast_products.py`) time their ways on the steps of the search that started the trial (a way is kept
per thread count); a search beside it runs whichever ways are bound at each step (scores up to rounding, as above).

The rule (`decoding_workers`; `workers_for` without a model): where the model is a PyTorch model on CPU at least
`MIN_D_MODEL` wide, the input has two batches or more, the largest of them has more than `TURN_TAKING_ROWS` rows
(sentences x beams: steps of no more are so short that two searches take turns at the interpreter lock) and the
thread-count setters are found, as many workers as the process has threads, at most `MAX_WORKERS`, each on its share
of the threads; else one batch at a time on every thread, as before. Never with alignments (they switch the shared
model's attention to eager while they read it) or sampling (searches side by side would draw from torch's one
generator in another order each run). `MAX_WORKERS` bounds how many searches share one interpreter lock: measured on
2 cores only, chosen, not measured, above. Switch: `VASWANI_DECODING_WORKERS=1` (or 0, off) decodes one batch at a
time; a number sets the workers (each then on threads / workers threads, at least one), whatever the model's width
or rows. `vaswani translate`'s light start runs its searches side by side at any rows (`light_translator.py`: its
steps have no one-thread rule of their own).

An error or an interrupt comes back at once, the batches not started dropped; a search already running has no point
to stop at, so it ends on its own (the command line's Ctrl-C ends the process instead of waiting for it:
`cli.main`).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from ..thread_counts import run_this_thread_on, thread_counts_settable

J = TypeVar("J")
R = TypeVar("R")

MAX_WORKERS = 4
# at and below this many rows a step is so short that two searches side by side mostly take turns at the interpreter
# lock (whole processes, one sentence a batch, greedy: int8 46.6 -> 28.0 sentences/s with two workers, though fp32
# 26.6 -> 32.7); above it two workers pay (beam 4, one sentence a batch: 12.7 -> 20.9), though each such step runs
# on one thread alone too (`step_threads.ONE_THREAD_ROWS`, 8): two searches keep both cores busy where one keeps one
TURN_TAKING_ROWS = 2
# below this width a step's operators are a few microseconds each: two searches then mostly take turns at the
# interpreter lock, which every operator releases and takes again (the built-in task's `tiny` model, d_model 32,
# greedy batches of 32: 1,644 -> 1,173 lines/s with two workers; the `small` preset, 256: 171 -> 294)
MIN_D_MODEL = 256
# jobs prepared ahead of the one whose result is awaited, per worker: enough that no worker waits for the next batch,
# few enough that memory holds a few batches whatever the input's length
AHEAD_PER_WORKER = 2


def asked_workers() -> int | None:
    """`VASWANI_DECODING_WORKERS`: None where unset or empty, else the number of workers it asks for (0 means 1)."""
    value = os.environ.get("VASWANI_DECODING_WORKERS", "").strip()
    if not value:
        return None
    if value.lower() in ("off", "false", "no"):
        return 1
    if not (value.isascii() and value.isdigit()):
        raise ValueError(
            f"VASWANI_DECODING_WORKERS={value!r} is not a number of workers: set it to how many batches are decoded "
            "at once (1 or 0: one at a time, on every thread) or leave it unset for the package's rule"
        )
    return max(int(value), 1)


def decoding_workers(model, batches: int, rows: int, *, alignments: bool = False, sampling: bool = False) -> int:
    """How many of `batches` batches of `model`'s decoding, of at most `rows` rows each (sentences x beams), run at
    once (see the module's docstring): 1 where workers cannot help, cannot be given their threads, or would change
    what comes out."""
    device = getattr(model, "device", None)
    on_cpu = isinstance(model, torch.nn.Module) and device is not None and torch.device(device).type == "cpu"
    # a GPU decodes one batch at a time; an ensemble or an ONNX runner keeps its own threads
    width = getattr(getattr(model, "config", None), "d_model", 0) if on_cpu else None
    return workers_for(batches, rows, width, alignments=alignments, sampling=sampling)


def workers_for(batches: int, rows: int, width: int | None, *, alignments: bool = False, sampling: bool = False,
                turn_taking_rows: int = TURN_TAKING_ROWS) -> int:  # fmt: skip
    """`decoding_workers` for a PyTorch model on CPU `width` wide (d_model; None: not one, one batch at a time),
    the model itself not needed (`vaswani translate`'s light start, `light_translator.py`, has none). At and
    below `turn_taking_rows` rows a batch, one batch at a time."""
    asked = asked_workers()
    if asked == 1 or batches < 2:
        return 1
    if asked is None and rows <= turn_taking_rows:
        return 1
    if alignments or sampling or width is None:  # see the module's docstring
        return 1
    if asked is None and width < MIN_D_MODEL:
        return 1
    threads = torch.get_num_threads()
    workers = asked if asked is not None else min(threads, MAX_WORKERS)
    if workers < 2 or not thread_counts_settable():  # else two workers would each run on every thread
        return 1
    return min(workers, batches)


def share_of_a_batch(model, lines: int, beams: int) -> int:
    """The batch size that splits one batch of `lines` lines, searched with `beams` beams, into a share per
    worker, decoded side by side (`vaswani serve`'s batches, formed of the lines waiting); `lines` where it is not
    split. Measured with the `small` preset trained on Multi30k, beam 4, ms a batch of random lines of test2016:
    8 lines 195 -> 144 in two shares, 32 lines 597 -> 447, 2 lines 98.6 -> 89.2."""
    workers = decoding_workers(model, lines, lines * beams)
    share = math.ceil(lines / workers)
    return lines if asked_workers() is None and share * beams <= TURN_TAKING_ROWS else share


def in_order(work: Callable[[J], R], jobs: Iterable[J], workers: int) -> Iterator[R]:
    """`map(work, jobs)`, with `workers` jobs running at once on threads of their own, each on its share of the
    process's threads; the results in the jobs' order. At most `AHEAD_PER_WORKER` jobs per worker are taken from
    `jobs` ahead of the result awaited. An error of a job is raised where its result comes, after the jobs before
    it; the jobs not yet started are then dropped (as they are when the caller stops reading)."""
    if workers <= 1:
        yield from map(work, jobs)
        return
    threads = max(torch.get_num_threads() // workers, 1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="vaswani-decoding", initializer=run_this_thread_on,
                              initargs=(threads,))  # fmt: skip
    pending: collections.deque[Future] = collections.deque()
    try:
        for job in jobs:
            pending.append(pool.submit(work, job))
            if len(pending) >= AHEAD_PER_WORKER * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    except BaseException:
        # an error, an interrupt, or a caller that stopped reading: back at once, the jobs not started dropped;
        # the ones running end on their own (a search has no point to stop at), their results unread
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
