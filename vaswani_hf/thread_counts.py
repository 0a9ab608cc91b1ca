# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""A thread's own thread count: the calling thread's operators on a number of threads of its own, other threads'
counts left alone. The decoding workers (`translation/batch_workers.py`: each batch searched on its share of the
process's threads), the one-thread steps (`model/speed/step_threads.py`) and the training's threads
(`training/training_speed.py`) set it. It needs torch alone, not Transformers: `vaswani translate`'s light start
(`translation/light_translator.py`) runs its workers without importing Transformers."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


class ThreadCount:
    """The calling thread's thread count, set through OpenMP's `omp_set_num_threads` and MKL's
    `MKL_Set_Num_Threads_Local` (the C name of `mkl_set_num_threads_local`: the lowercase symbol is MKL's Fortran
    one, which takes a pointer), as torch's own OpenMP runtime and MKL read them (each is per thread)."""

    def __init__(self, omp_set: Callable[[int], None], mkl_set_local: Callable[[int], int] | None) -> None:
        self.omp_set, self.mkl_set_local = omp_set, mkl_set_local

    @classmethod
    @functools.cache
    def of_torch(cls) -> ThreadCount | None:
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
    return ThreadCount.of_torch() is not None


def run_this_thread_on(threads: int) -> bool:
    """From now on, the calling thread's operators run on `threads` threads (OpenMP's and MKL's counts of this thread
    alone: a decoding worker's, `translation/batch_workers.py`); False, and nothing set, where the setters are not
    found. torch sets a thread's count from the process's at the thread's first parallel operator, so that is
    done first (`torch.get_num_threads()` runs it), and this count then holds."""
    count = ThreadCount.of_torch()
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
    count = ThreadCount.of_torch()
    if count is None:
        yield False
        return
    before = torch.get_num_threads()
    mkl_local = count.set(threads)
    try:
        yield True
    finally:
        count.restore(before, mkl_local)
