"""Dynamic batching for `vaswani serve`: the lines of concurrent requests wait in one queue; a single model worker
takes token-budget batches of lines of similar length and translates each batch in one call of the function
`vaswani translate` uses (`translate_nbest`: the same empty-line and long-line rules, the same search).

A batch is formed when `max_wait_ms` have passed since its oldest line arrived, or when the waiting lines fill
`max_batch_tokens` (padded: lines x longest, as `vaswani translate --max-tokens` counts). After a batch, the clients
whose requests it finished send their next lines: the next batch waits for them, until a line from each and the
lines it left waiting are there, for up to a tenth of its time (at least `max_wait_ms`, at most ten times it).
Clients slower to come back than `max_wait_ms` (on a busy machine, 32 of them took 65-100 ms) would otherwise split
into two groups taking turns in half-full batches; and a lone client's next line goes at once instead of waiting
for company.
A batch holds the oldest line, so none starves, and the lines nearest it in length with the same decoding options.
A request's lines may travel in different batches; each line's result is set on its own future, so a request gets
them back in order. A line whose request was abandoned (its client left, or its time ran out) is dropped before it
is batched. A batch that fails is translated again line by line, so that a line that fails alone (too long, say)
fails only its own request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Line:
    """One line of a request, waiting for its batch."""

    text: str
    tokens: int
    options: tuple  # the decoding options (sorted items): lines with other options go in other batches
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    abandoned: bool = False
    request: object = None  # shared by the lines of one request: its client comes back when all are answered


@dataclass
class BatchStats:
    """What the worker did with one batch, for the metrics."""

    lines: int
    tokens: int
    seconds: float
    output_tokens: int = 0
    error: str | None = None


class DynamicBatcher:
    """The queue and its one worker thread. `translate(texts, options)` translates a batch (a list of lines) and
    returns one result per line; `count_tokens(text)` measures a line; `on_batch(BatchStats)` hears of each
    batch, `on_drop(lines)` of abandoned lines dropped unbatched. `max_batch_tokens` 0 or a value below any line's
    length makes every batch one line (batching off)."""

    def __init__(self, translate: Callable[[list[str], dict], list], count_tokens: Callable[[str], int],
                 max_batch_tokens: int = 4096, max_wait_ms: float = 10.0,
                 on_batch: Callable[[BatchStats], None] | None = None,
                 on_drop: Callable[[int], None] | None = None) -> None:  # fmt: skip
        self.translate, self.count_tokens = translate, count_tokens
        self.max_batch_tokens, self.max_wait = max_batch_tokens, max_wait_ms / 1000
        self.on_batch = on_batch or (lambda stats: None)
        self.on_drop = on_drop or (lambda lines: None)
        self.waiting: list[Line] = []  # in arrival order
        self.condition = threading.Condition()
        self.stopped = False
        self.busy = False
        self.free_since = 0.0  # when the last batch ended
        self.last_seconds = 0.0  # how long it took
        self.expected = 0  # lines it left waiting, and one per request it finished: the next batch's, all back
        self.worker = threading.Thread(target=self._work, name="vaswani-serve-model", daemon=True)
        self.worker.start()

    @property
    def depth(self) -> int:
        """Lines waiting for a batch."""
        return len(self.waiting)

    def submit(self, texts: list[str], options: dict, loop: asyncio.AbstractEventLoop,
               tokens: list[int] | None = None, max_depth: int | None = None) -> list[Line] | None:  # fmt: skip
        """Queue a request's lines (their token counts, when the caller has them); await each line's `future` for
        its result. None, and nothing queued, when the lines would take the queue past `max_depth`."""
        key = tuple(sorted(options.items()))
        counts = tokens if tokens is not None else [self.count_tokens(text) for text in texts]
        request = object()
        lines = [Line(text, count, key, loop.create_future(), loop, request=request)
                 for text, count in zip(texts, counts, strict=True)]  # fmt: skip
        with self.condition:
            if max_depth is not None and len(self.waiting) + len(lines) > max_depth:
                return None
            self.waiting.extend(lines)
            self.condition.notify()
        return lines

    @staticmethod
    def abandon(lines: list[Line]) -> None:
        """The request is gone: its lines not yet batched are dropped."""
        for line in lines:
            line.abandoned = True

    def stop(self, timeout: float | None = 60) -> None:
        """Stop the worker after the batch it has, waiting at most `timeout` seconds for it (None: until then)."""
        with self.condition:
            self.stopped = True
            self.condition.notify()
        self.worker.join(timeout=timeout)

    def _next_batch(self) -> list[Line] | None:
        """Wait for lines, then for the oldest line's deadline or a full budget; take its batch."""
        with self.condition:
            while True:
                kept = [line for line in self.waiting if not line.abandoned]
                if len(kept) < len(self.waiting):
                    self.on_drop(len(self.waiting) - len(kept))
                self.waiting = kept
                if self.stopped:
                    return None
                if not self.waiting:
                    self.condition.wait()
                    continue
                now, patience = time.monotonic(), self._patience()
                left = max(self.waiting[0].arrived + self.max_wait, self.free_since + patience) - now
                # the answered clients are back: only while their time after the batch lasts (a burst after a
                # quiet spell waits max_wait for company, as the first lines of any burst do)
                back = now < self.free_since + patience and 0 < self.expected <= len(self.waiting)
                if left > 0 and not back and self._padded(self.waiting) < self.max_batch_tokens:
                    self.condition.wait(timeout=left)
                    continue
                batch = self._batch_around(self.waiting[0])
                taken = set(map(id, batch))
                self.waiting = [line for line in self.waiting if id(line) not in taken]
                return batch

    def _patience(self) -> float:
        """How long the next batch waits after a batch for the clients it answered to send their next lines: a
        tenth of that batch's time, between `max_wait` and ten times it (they share the next batch instead of waiting
        behind a small one; the model idles a tenth at most)."""
        return min(max(self.max_wait, self.last_seconds / 10), 10 * self.max_wait)

    def _batch_around(self, oldest: Line) -> list[Line]:
        """The oldest line and the lines nearest it in length (same options), while lines x longest fits."""
        alike = sorted((line for line in self.waiting if line.options == oldest.options), key=lambda x: x.tokens)
        at = next(i for i, line in enumerate(alike) if line is oldest)
        low, high = at, at + 1  # the batch is alike[low:high]
        while True:
            grown = None
            for start, end in ((low - 1, high), (low, high + 1)):
                # sorted by length: the batch's padded size is its size times its last line's length
                if start < 0 or end > len(alike) or (end - start) * alike[end - 1].tokens > self.max_batch_tokens:
                    continue
                gap = abs(alike[start if start < low else end - 1].tokens - alike[at].tokens)
                if grown is None or gap < grown[0]:
                    grown = (gap, start, end)
            if grown is None:
                return alike[low:high]
            _, low, high = grown

    @staticmethod
    def _padded(lines: list[Line]) -> int:
        return len(lines) * max((line.tokens for line in lines), default=0)

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            self.busy = True
            start = time.monotonic()
            stats = BatchStats(len(batch), self._padded(batch), 0.0)
            try:
                results = self.translate([line.text for line in batch], dict(batch[0].options))
            except Exception as err:  # the next batch is served as usual
                stats.error = type(err).__name__
                results = self._one_by_one(batch) if len(batch) > 1 else [_failure(err)]
            for line, result in zip(batch, results, strict=True):
                failed = isinstance(result, RuntimeError)
                _hand_back(line, None if failed else result, result if failed else None)
            stats.output_tokens = sum(getattr(result, "tokens", 0) for result in results)
            stats.seconds = time.monotonic() - start
            with self.condition:
                self.busy, self.free_since, self.last_seconds = False, time.monotonic(), stats.seconds
                # the lines left waiting, and a line from each client whose request this batch finished (a request
                # with lines still waiting is no client coming back)
                unfinished = {id(line.request) for line in self.waiting}
                finished = {id(line.request) for line in batch} - unfinished
                self.expected = len(self.waiting) + len(finished)
            self.on_batch(stats)

    def _one_by_one(self, batch: list[Line]) -> list:
        """A failed batch's lines, each alone: a line that fails again gets its cause, the others their
        translations (a line the model cannot take must not fail the requests it shared a batch with)."""
        results = []
        for line in batch:
            if line.abandoned:
                results.append(_failure(ConnectionAbortedError("the request was abandoned")))
                continue
            try:
                (result,) = self.translate([line.text], dict(line.options))
            except Exception as err:
                result = _failure(err)
            results.append(result)
        return results


def _failure(err: Exception) -> RuntimeError:
    return RuntimeError(f"{type(err).__name__}: {err}")


def _hand_back(line: Line, result, error: BaseException | None) -> None:
    """The line's result to its request's event loop (the worker must outlive a loop that is gone)."""
    _hand_to(line.loop, line.future, result, error)


def _hand_to(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result, error: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop was closed: nobody waits for this any more
        pass


def in_daemon_thread(work: Callable[[], Any], name: str) -> asyncio.Future:
    """`work()` in a daemon thread of its own, its result (or its exception) set on the returned future of the
    running loop: loading or unloading a model never holds up the event loop, nor (a daemon) the process's exit
    (asyncio.to_thread's executor threads are joined at exit: a load under way would delay a stop)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as err:  # handed to the waiting coroutine, which decides
            result, error = None, err
        _hand_to(loop, future, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    if future.done():  # cancelled: the request timed out or its client left
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
