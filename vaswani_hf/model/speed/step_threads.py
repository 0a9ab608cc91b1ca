# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""A decoding step with few rows runs on one thread.

At up to eight rows (greedy search of one sentence, beam 4 of one or two, the last sentences of a batch) each of a
step's operators is microseconds of arithmetic, and splitting it over threads costs more than it saves: the other
threads must be woken for every parallel operator (OpenMP's passive wait policy, which the package sets so that a
process beside a busy neighbour keeps its share, see docs/engines-performance.md) or spin between them (which a
neighbour turns into waits for a parked thread). On one thread the step has no parallel region at all.
Measured on 2 cores of an AMD EPYC (Zen 4), `benchmarks/step_threads.py`, ms a step, all threads against one: the
`small` preset, greedy, 1 row 4.06 / 2.12, 3 rows 4.92 / 3.12, 6 rows 6.01 / 3.84, 8 rows 4.97 / 4.69, 12 rows 4.96
/ 4.97, 32 rows 9.66 / 10.26; beam 4, 4 rows 5.31 / 3.41, 8 rows 6.46 / 4.20, 16 rows 5.95 / 5.14; the `base`
preset, greedy, 4 rows 13.84 / 11.05, 8 rows 21.03 / 17.30, 16 rows 25.54 / 25.12; capped to AVX2 (as a Zen 3), the
`small` preset, greedy, 4 rows 4.85 / 3.73, 8 rows 6.19 / 6.18, but 12 rows 5.28 / 6.45: `ONE_THREAD_ROWS` is 8,
the most rows measured at which one thread was no slower on every kind. (On a Zen 3, before the lean step and the
halves' product, three to eight rows ran slower on one thread, and the bound was two: docs/engines-performance.md.)

The thread count changes how a product's sums may be split, so a step's last bits may differ from the same step on
all threads (MKL's single-precision products did at 5-11 rows, not at 1-4, on that machine): this is one of the
fast products (`FastCpuProducts`, same tokens, scores up to rounding), off with them, and off alone with
`VASWANI_ONE_THREAD_ROWS=0` (or another number of rows). The count is the calling thread's alone (OpenMP's and
MKL's thread-local counts, `_ThreadCount`), set back after each step: a server's other decoding threads keep theirs.
Where those setters are not found, the rule is off: `torch.set_num_threads` would also set the count that a thread
takes at its first parallel operator, so a thread started during one of these steps would keep one thread for good.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import torch

from ..generation_vaswani import switched_off

T = TypeVar("T")

ONE_THREAD_ROWS = 8  # measured: benchmarks/step_threads.py; docs/engines-performance.md


def one_thread_rows() -> int:
    """The rows at and below which a decoding step runs on one thread: `VASWANI_ONE_THREAD_ROWS` (0 turns it off),
    else `ONE_THREAD_ROWS`."""
    if switched_off("VASWANI_ONE_THREAD_ROWS"):
        return 0
    value = os.environ.get("VASWANI_ONE_THREAD_ROWS", "").strip()
    if not value:
        return ONE_THREAD_ROWS
    if not (value.isascii() and value.isdigit()):
        raise ValueError(
            f"VASWANI_ONE_THREAD_ROWS={value!r} is not a number of rows: set it to the most rows a one-thread step "
            f"may have (0 turns the one-thread steps off) or leave it unset for {ONE_THREAD_ROWS}"
        )
    return int(value)


def threads_for(rows: int) -> int:
    """The threads a step of `rows` rows runs on: one where they are few, else the calling thread's count (the
    fast products' measured ways are kept per thread count: a way timed on two threads may be slow on one)."""
    if rows <= one_thread_rows() and _ThreadCount.of_torch() is not None:
        return 1
    return torch.get_num_threads()


class _ThreadCount:
    """The calling thread's thread count, set through OpenMP's `omp_set_num_threads` and MKL's
    `MKL_Set_Num_Threads_Local` (the C name of `mkl_set_num_threads_local`: the lowercase symbol is MKL's Fortran
    one, which takes a pointer), as torch's own OpenMP runtime and MKL read them (each is per thread)."""

    def __init__(self, omp_set: Callable[[int], None], mkl_set_local: Callable[[int], int] | None) -> None:
        self.omp_set, self.mkl_set_local = omp_set, mkl_set_local

    @classmethod
    @functools.cache
    def of_torch(cls) -> _ThreadCount | None:
        """The setters of the libraries torch itself is linked to, or None where they are not found or do not set
        what torch reads. Looked up through `libtorch_cpu`'s own handle, whose lookup searches its dependencies: the
        OpenMP runtime torch uses, even where another (a preloaded libgomp or libiomp) was loaded first."""
        library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
        if os.name != "posix" or not library.is_file():
            return None
        try:
            torch_cpu = ctypes.CDLL(str(library))
            omp_set = torch_cpu.omp_set_num_threads
        except (OSError, AttributeError):
            return None
        mkl_set_local = None
        if torch.backends.mkl.is_available():
            try:
                mkl_set_local = torch_cpu.MKL_Set_Num_Threads_Local
            except AttributeError:
                return None
        count = cls(omp_set, mkl_set_local)
        threads = torch.get_num_threads()
        if threads > 1:  # a setter that torch does not read would leave its count as it was
            previous = count.set(1)
            works = torch.get_num_threads() == 1
            count.restore(threads, previous)
            if not works:
                return None
        return count

    def set(self, threads: int) -> int | None:
        self.omp_set(threads)
        return self.mkl_set_local(threads) if self.mkl_set_local is not None else None

    def restore(self, threads: int, mkl_local: int | None) -> None:
        self.omp_set(threads)
        if self.mkl_set_local is not None:
            self.mkl_set_local(mkl_local)


def thread_counts_settable() -> bool:
    """Whether a thread's own count can be set here (`run_this_thread_on`): the setters found, and read by torch."""
    return _ThreadCount.of_torch() is not None


def run_this_thread_on(threads: int) -> bool:
    """From now on, the calling thread's operators run on `threads` threads (OpenMP's and MKL's counts of this thread
    alone: a decoding worker's, `translation/batch_workers.py`); False, and nothing set, where the setters are not
    found. torch sets a thread's count from the process's at the thread's first parallel operator, so that is
    done first (`torch.get_num_threads()` runs it), and this count then holds."""
    count = _ThreadCount.of_torch()
    if count is None:
        return False
    torch.get_num_threads()  # torch's own first-use setting of this thread's count, before ours
    count.set(threads)
    return torch.get_num_threads() == threads


@contextlib.contextmanager
def this_thread_on(threads: int) -> Iterator[bool]:
    """Inside the block the calling thread's operators run on `threads` threads; after it, on its count before.
    Other threads' counts, and the count a thread started meanwhile takes, stay the process's (`torch.set_num_threads`
    would set that too, and a thread that first used torch inside the block would keep it). Yields False, and sets
    nothing, where the setters are not found."""
    count = _ThreadCount.of_torch()
    if count is None:
        yield False
        return
    before = torch.get_num_threads()
    mkl_local = count.set(threads)
    try:
        yield True
    finally:
        count.restore(before, mkl_local)


def by_rows(product: Callable[..., T], rows_of: Callable[..., int]) -> Callable[..., T]:
    """`product`, run on one thread where its rows (`rows_of` its arguments) are few, on the caller's threads
    otherwise."""

    def run(*args) -> T:
        threads = torch.get_num_threads()
        if threads == 1 or threads_for(rows_of(*args)) != 1:  # one only where the setters are found
            return product(*args)
        count = _ThreadCount.of_torch()
        mkl_local = count.set(1)
        try:
            return product(*args)
        finally:
            count.restore(threads, mkl_local)

    run.__doc__ = product.__doc__
    run.__wrapped__ = product
    return run


def search_by_rows(searching: Callable[[object, int], contextlib.AbstractContextManager]):
    """`searching(model, rows)`, the context a search steps in, with the whole search on one thread where its rows
    are few: its own operators too (a beam search's log-softmax, top-k and cache reorders over rows x vocabulary),
    each of which on all threads wakes the others as a step's products do. A search whose rows start above the
    bound keeps the caller's threads, its steps taking one thread as their rows fall (`by_rows`)."""

    @contextlib.contextmanager
    def run(model, rows: int) -> Iterator[None]:
        if torch.get_num_threads() > 1 and threads_for(rows) == 1:
            with this_thread_on(1), searching(model, rows):
                yield
        else:
            with searching(model, rows):
                yield

    run.__doc__ = searching.__doc__
    run.__wrapped__ = searching
    return run
