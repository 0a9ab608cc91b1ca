# Copyright 2026 The vaswani-hf authors. Licensed under the Apache License, Version 2.0.
"""A decoding step with few rows runs on one thread, and a search that starts with few rows runs on one thread whole.

At up to eight rows of a model up to 256 wide (the `small` preset: greedy search of up to eight sentences, beam 4
of one or two, the last sentences of a batch), or two rows of a wider one, each of a step's operators is
microseconds of arithmetic, and splitting it over threads costs more than it saves: the other threads must be woken
for every parallel operator (OpenMP's passive wait policy, which the package sets so that a process beside a busy
neighbour keeps its share, see docs/engines-performance.md) or spin between them (which a neighbour turns into
waits for a parked thread). On one thread the step has no parallel region at all. Measured on 2 cores of an AMD
EPYC (Zen 4), docs/engines-performance.md ("One-thread steps"): the trained `small` model, beam 4 of one sentence a
call over 130 sentences, 9.2-12.1 sentences/s at the old bound of two rows, mostly 15-19 at eight; `vaswani serve`
with one client 0.67x -> 0.96x CTranslate2's; but the `base` preset (512 wide), beam 4 of one sentence, ran
1.13-1.2x slower on one thread than on two: `ONE_THREAD_ROWS` is 8 up to `NARROW_D_MODEL` wide, 2 above. (On a Zen
3, before the lean step and the halves' product, three to eight rows of the `small` preset ran slower on one
thread.) A search within the bound runs its own operators on one thread too (`search_by_rows`: a beam search's
log-softmax over rows x vocabulary), but for the projection of every source token at its first step, which takes
the caller's threads where the sources are many (`callers_threads_for`).

The thread count changes how a product's sums may be split, so a step's last bits may differ from the same step on
all threads (MKL's single-precision products did at 5-11 rows, not at 1-4, on a Zen 3): this is one of the
fast products (`FastCpuProducts`, same tokens, scores up to rounding), off with them, and off alone with
`VASWANI_ONE_THREAD_ROWS=0` (or another number of rows). The count is the calling thread's alone (OpenMP's and
MKL's thread-local counts, `thread_counts.py`), set back after each step or search: a server's other decoding threads
keep theirs. Where those setters are not found, the rule is off: `torch.set_num_threads` would also set the count
that a thread takes at its first parallel operator, so a thread started during one of these steps would keep one
thread for good.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from ...thread_counts import ThreadCount, this_thread_on
from ..generation_vaswani import switched_off

T = TypeVar("T")

ONE_THREAD_ROWS = 8  # measured: benchmarks/step_threads.py; docs/engines-performance.md
# the widest model (d_model) whose steps of up to `ONE_THREAD_ROWS` rows run on one thread; a wider one's products
# are larger, and its steps of up to `WIDE_ONE_THREAD_ROWS` rows do (the `base` preset, 512 wide, beam 4 of one
# sentence: 4 rows on one thread ran 1.13-1.2x slower than on two, 60 sentences in each of two processes)
NARROW_D_MODEL = 256
WIDE_ONE_THREAD_ROWS = 2


def one_thread_rows(width: int | None = None) -> int:
    """The rows at and below which a decoding step of a model `width` wide (d_model; None: as narrow as
    `NARROW_D_MODEL`) runs on one thread: `VASWANI_ONE_THREAD_ROWS` (0 turns it off) for every width, else
    `ONE_THREAD_ROWS` up to `NARROW_D_MODEL` wide and `WIDE_ONE_THREAD_ROWS` above."""
    if switched_off("VASWANI_ONE_THREAD_ROWS"):
        return 0
    value = os.environ.get("VASWANI_ONE_THREAD_ROWS", "").strip()
    if not value:
        return ONE_THREAD_ROWS if width is None or width <= NARROW_D_MODEL else WIDE_ONE_THREAD_ROWS
    if not (value.isascii() and value.isdigit()):
        raise ValueError(
            f"VASWANI_ONE_THREAD_ROWS={value!r} is not a number of rows: set it to the most rows a one-thread step "
            f"may have (0 turns the one-thread steps off) or leave it unset for {ONE_THREAD_ROWS} ("
            f"{WIDE_ONE_THREAD_ROWS} for a model wider than {NARROW_D_MODEL})"
        )
    return int(value)


def threads_for(rows: int, width: int | None = None) -> int:
    """The threads a step of `rows` rows of a model `width` wide runs on: one where they are few, else the calling
    thread's count (the fast products' measured ways are kept per thread count: a way timed on two threads may be
    slow on one)."""
    if rows <= one_thread_rows(width) and ThreadCount.of_torch() is not None:
        return 1
    return torch.get_num_threads()


# the calling thread's count before a search or a step of few rows took it to one (`by_rows`, `search_by_rows`)
_CALLERS = threading.local()


@contextlib.contextmanager
def _on_one_thread(threads: int) -> Iterator[None]:
    before = getattr(_CALLERS, "threads", None)
    _CALLERS.threads = threads
    try:
        with this_thread_on(1):
            yield
    finally:
        _CALLERS.threads = before


@contextlib.contextmanager
def callers_threads_for(rows: int, width: int | None = None) -> Iterator[None]:
    """A product of `rows` rows inside a search or step that its few decoder rows put on one thread, on the caller's
    threads where `rows` are more than a one-thread step's: the cross-attention's projection of every source token
    at a search's first step (eight sentences of 500 tokens ran 1.2x slower with it on one thread). The bound counts
    the decoder's rows, not the sources'."""
    threads = getattr(_CALLERS, "threads", None)  # set only inside `_on_one_thread`
    with contextlib.nullcontext() if threads is None or rows <= one_thread_rows(width) else this_thread_on(threads):
        yield


def by_rows(
    product: Callable[..., T], rows_of: Callable[..., int], width_of: Callable[..., int] | None = None
) -> Callable[..., T]:
    """`product`, run on one thread where its rows (`rows_of` its arguments) are few for the model's width
    (`width_of` them, d_model), on the caller's threads otherwise."""

    def run(*args) -> T:
        threads = torch.get_num_threads()
        width = width_of(*args) if width_of is not None else None
        if threads == 1 or threads_for(rows_of(*args), width) != 1:  # one only where the setters are found
            return product(*args)
        with _on_one_thread(threads):
            return product(*args)

    run.__doc__ = product.__doc__
    run.__wrapped__ = product
    return run


def by_hidden_rows(product: Callable[..., T]) -> Callable[..., T]:
    """`by_rows` for a product of (model, hidden states): their rows, their width."""
    return by_rows(product, lambda model, hidden: hidden.shape[0], lambda model, hidden: hidden.shape[-1])


def by_token_rows(step: Callable[..., T]) -> Callable[..., T]:
    """`by_rows` for a decoder step of (state, newest tokens): a row a token, the encoder's width."""
    return by_rows(step, lambda state, tokens: tokens.shape[0], lambda state, tokens: state.encoder_hidden.shape[-1])


def search_by_rows(searching: Callable[[object, int], contextlib.AbstractContextManager]):
    """`searching(model, rows)`, the context a search steps in, with the whole search on one thread where its rows
    are few: its own operators too (a beam search's log-softmax, top-k and cache reorders over rows x vocabulary),
    each of which on all threads wakes the others as a step's products do, and a caller's logits processors and
    stopping criteria. A search whose rows start above the bound keeps the caller's threads, its steps taking one
    thread as their rows fall (`by_rows`); the sources' projection at the first step takes the caller's threads
    where the sources are long (`callers_threads_for`)."""

    @contextlib.contextmanager
    def run(model, rows: int) -> Iterator[None]:
        threads = torch.get_num_threads()
        few = threads > 1 and threads_for(rows, getattr(getattr(model, "config", None), "d_model", None)) == 1
        with _on_one_thread(threads) if few else contextlib.nullcontext(), searching(model, rows):
            yield

    run.__doc__ = searching.__doc__
    run.__wrapped__ = searching
    return run
