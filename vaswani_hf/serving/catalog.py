"""Many models behind one URL, as a LibreTranslate instance serves every pair it has installed: each model's pair,
the routes between languages, and the models in memory.

A route is direct (one model), composed through a pivot language both sides share (two models: the first model's
best translated by the second, as translating twice gives it; n-best: the first model's n candidates, the
second's n for each, scores summed, the best kept, as argos-translate composes), or the identity (every served
language translates to itself: the text comes back as it is). Where several pivots exist, the one whose weaker
model scored best on its held-out data (its training facts' BLEU) is taken.

Models load when first asked for and, past `--max_loaded`, take turns in memory (`Catalog`'s docstring says how:
a request for a model not in memory waits in line, within its time, and no pair starves); a parser is a model like
any other. LibreTranslate loads every model it meets and never unloads one: its users saw memory grow until the
process was killed. A model that fails to load is reported (its requests get 503 naming it and the cause) and tried
again with backoff, never per request; its files are checked before any model is unloaded for it.

The catalog is also the server's state the app reads: its settings, metrics, readiness, draining and requests in
flight, whichever model serves a request."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .batching import in_daemon_thread
from .service import LANGUAGE_NAMES, Metrics, Overloaded, Service, Settings, Translation


@dataclass(frozen=True)
class ServedModel:
    """One model folder and the pair it serves; `routed`: requests reach it by their source and target (a
    translator), else by routes of its own (a parser: source = target, POST /parse), loaded at start and kept."""

    model_dir: str
    source: str
    target: str
    routed: bool = True
    score: float | None = None  # held-out BLEU from its training facts: chooses between pivots

    @property
    def name(self) -> str:
        return Path(self.model_dir).name or self.model_dir

    @property
    def pair(self) -> str:
        return f"{self.source}->{self.target}"


@dataclass(frozen=True)
class Route:
    """How `source` becomes `target`: the models in order (none: the identity)."""

    source: str
    target: str
    models: tuple[ServedModel, ...]
    # a composed route's other pivots, strongest first: taken while a model of `models` is failing
    others: tuple[tuple[ServedModel, ...], ...] = field(default=(), compare=False)

    @property
    def pivot(self) -> str | None:
        return self.models[0].target if len(self.models) == 2 else None

    def describe(self) -> dict:
        return {"source": self.source, "target": self.target, "pivot": self.pivot,
                "models": [m.name for m in self.models], "composed": self.pivot is not None}  # fmt: skip


class ModelLoading(Exception):
    """The model a request needs did not load within the request's time: retry after `retry_after` seconds."""

    def __init__(self, model: ServedModel, retry_after: int) -> None:
        super().__init__(f"the model for {model.pair} ({model.name}) is loading: retry in {retry_after} s")
        self.retry_after = retry_after


class NoRoute(LookupError):
    """No model (nor pair of models) goes from the source to the target; `unknown` is a language not served."""

    def __init__(self, source: str, target: str, unknown: str | None) -> None:
        self.source, self.target, self.unknown = source, target, unknown
        name = LANGUAGE_NAMES.get
        super().__init__(f"{unknown} is not supported" if unknown else f"{name(target, target)} ({target}) is not "
                         f"available as a target language from {name(source, source)} ({source})")  # fmt: skip


def check_models(models: list[ServedModel]) -> None:
    """Two models for one pair (or a parser and a translator for one route) cannot be told apart by a request."""
    parsers = [model for model in models if not model.routed]
    if len(parsers) > 1:
        raise ValueError(f"{parsers[0].model_dir} and {parsers[1].model_dir} are both parsers: POST /parse names no "
                         "language, so serve one parser a server.")  # fmt: skip
    seen: dict[tuple[str, str], ServedModel] = {}
    for model in models:
        other = seen.setdefault((model.source, model.target), model)
        if other is not model:
            raise ValueError(f"{other.model_dir} and {model.model_dir} both serve {model.pair}: a request names only "
                             "the languages, so serve one of them (or each in its own server).")  # fmt: skip


def plan_routes(models: list[ServedModel]) -> dict[tuple[str, str], Route]:
    """Every route the models make: direct, composed through the best pivot, and each language to itself."""
    direct = {(m.source, m.target): m for m in models if m.routed}
    routes = {pair: Route(*pair, (model,)) for pair, model in direct.items()}
    languages = {code for pair in direct for code in pair}
    for code in languages:
        routes.setdefault((code, code), Route(code, code, ()))

    def strength(pair: tuple[ServedModel, ServedModel]) -> tuple:
        # the weaker model's score (a pair with an unscored model ranks after every scored one); then English, the
        # usual pivot; then the code, so the choice never depends on the order the models were given
        scores = [m.score for m in pair]
        return (min(scores) if None not in scores else -math.inf, pair[0].target == "en", pair[0].target)

    composed: dict[tuple[str, str], list[tuple[ServedModel, ServedModel]]] = {}
    for (source, pivot), first in direct.items():
        for (middle, target), second in direct.items():
            if middle == pivot and source != target and (source, target) not in direct:
                composed.setdefault((source, target), []).append((first, second))
    for (source, target), chains in composed.items():
        best, *others = sorted(chains, key=strength, reverse=True)  # (stable: ties keep the models' order)
        routes[(source, target)] = Route(source, target, best, tuple(others))
    return routes


def release_memory() -> None:
    """Give freed memory back to the system after a model is unloaded (glibc keeps it otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@dataclass
class LoadFailure:
    """A model that failed to load (or whose files failed their check): why, how often in a row, and when it is
    tried again (backoff doubling from 5 s to 5 minutes: a broken folder is not reloaded per request)."""

    cause: str
    attempts: int
    retry_at: float  # time.monotonic()

    @property
    def retry_in(self) -> int:
        return max(1, math.ceil(self.retry_at - time.monotonic()))

    def describe(self) -> dict:
        return {"cause": self.cause, "attempts": self.attempts, "retry_in": self.retry_in}


class ModelFailed(Exception):
    """The model a request needs failed to load: the request is answered 503 naming the model and the cause."""

    def __init__(self, model: ServedModel, failure: LoadFailure) -> None:
        super().__init__(f"the model for {model.pair} ({model.name}) failed to load: {failure.cause}; it is tried "
                         f"again in {failure.retry_in} s")  # fmt: skip
        self.retry_after = failure.retry_in


class Turn:
    """The requests waiting for one model to be in memory (and their lines, counted in the queue): admitted
    together when it is, in the order the models were first asked for."""

    def __init__(self) -> None:
        self.waiters: list[tuple[asyncio.Future, int]] = []  # (admitted or failed, the request's lines)
        self.checked = False  # the model's files read in this turn: it may load (and a model be closed for it)

    @property
    def lines(self) -> int:
        return sum(lines for future, lines in self.waiters if not future.done())


class Catalog:
    """The models served, their routes, the ones in memory, and the server's state (see the module's docstring).

    `load(model, metrics)` builds a model's warmed `Service` (in a thread of its own), giving it `device_lock`, so
    that the models take turns on the device; `check(model)` (optional) reads its files without building it, so that
    a broken folder is found before a good model is unloaded for it; `device` and `precision` say where and how the
    models run (`load` sets them).

    Taking turns, with --max_loaded: a request for a model in memory is served at once, unless the model is being
    closed for a model waiting for room; else it waits in line (a `Turn` per model, first asked first served). The
    first turn in line gets a slot: a free one, or one freed by closing a model (an idle one first, else the least
    recently used): a closed model takes no new requests, finishes those it has, and is unloaded; then the waiting
    model loads and all its waiting requests are admitted at once. Requests for the closed model that came meanwhile
    wait in line behind it, so no pair starves, whatever the traffic. Loading, unloading and freeing memory run in
    threads of their own; the event loop only moves requests between these states."""

    def __init__(self, models: list[ServedModel], settings: Settings, load: Callable[[ServedModel, Metrics], Service],
                 max_loaded: int | None = None,
                 check: Callable[[ServedModel], None] | None = None) -> None:  # fmt: skip
        check_models(models)
        self.models, self.settings, self.load, self.max_loaded = models, settings, load, max_loaded
        self.check = check
        self.metrics = Metrics()
        self.routes = plan_routes(models)
        self.loaded: OrderedDict[ServedModel, Service] = OrderedDict()  # least recently used first
        self.loading: dict[ServedModel, asyncio.Future] = {}
        self.unloading: dict[ServedModel, asyncio.Future] = {}  # still holding memory: their slots are not free
        self.checking: dict[ServedModel, asyncio.Future] = {}
        self.failed: dict[ServedModel, LoadFailure] = {}
        self.turns: OrderedDict[ServedModel, Turn] = OrderedDict()  # the line, first asked first
        self.closing: set[ServedModel] = set()  # loaded, taking no new requests: unloaded when the last one ends
        self.using: dict[ServedModel, int] = {}
        self.ready = self.draining = False
        self.progress = {"loaded": 0, "of": 0, "loading": None}  # the preload's, for /health
        self.in_flight = 0
        self.load_seconds = 10.0  # the last load's time, for Retry-After
        # one batch at a time on the device, whichever model's: two workers at once on the same cores split them
        # and batch less (measured on 2 cores, two models under mixed load: 0.67 of one model's lines/s)
        self.device_lock = threading.Lock()
        self.load_lock = threading.Lock()
        self.device, self.precision = "-", "-"

    @classmethod
    def of(cls, service: Service, routed: bool = True) -> Catalog:
        """A catalog of one model already loaded (`create_app(service)` in process: tests, an embedding app)."""
        model = ServedModel(service.model_dir, service.source, service.target, routed)
        catalog = cls([model], service.settings, load=lambda _model, _metrics: service)
        catalog.metrics, catalog.ready = service.metrics, service.ready
        catalog.device, catalog.precision = service.device, service.precision
        catalog._loaded(model, service)
        return catalog

    # --- what the app reads ------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        """Lines waiting: for a batch, and for their model to load."""
        batched = sum(service.batcher.depth for service in self.loaded.values())
        return batched + sum(turn.lines for turn in self.turns.values())

    @property
    def translators(self) -> list[ServedModel]:
        return [m for m in self.models if m.routed]

    def parser_model(self) -> ServedModel | None:
        return next((m for m in self.models if not m.routed), None)

    def sources(self) -> list[str]:
        """Every served language, in the order the models name them (the first model's source first)."""
        return list(dict.fromkeys(code for m in self.translators for code in (m.source, m.target)))

    def targets_of(self, source: str) -> list[str]:
        """What `source` translates to: the models' targets, then those composed, then itself."""
        reached = [t for (s, t), route in self.routes.items() if s == source and len(route.models) == 1]
        composed = sorted(t for (s, t), route in self.routes.items() if s == source and len(route.models) == 2)
        return [*reached, *composed, *([source] if (source, source) in self.routes else [])]

    def targets(self) -> list[str]:
        """Every language some served language translates to (the schema's targets)."""
        return list(dict.fromkeys(target for source in self.sources() for target in self.targets_of(source)))

    def route(self, source: str, target: str) -> Route:
        """The route a request from `source` to `target` takes: a composed one through another pivot while a model
        of its best is failing (and one of another pivot is not); NoRoute where none is served."""
        if (source, target) in self.routes:
            route = self.routes[(source, target)]
            if any(model in self.failed for model in route.models):
                working = next((o for o in route.others if not any(model in self.failed for model in o)), None)
                if working is not None:
                    return Route(source, target, working)
            return route
        served = set(self.sources())
        unknown = next((code for code in (source, target) if code not in served), None)
        raise NoRoute(source, target, unknown)

    def default_pair(self) -> tuple[str, str]:
        first = (self.translators or self.models)[0]
        return first.source, first.target

    def state_facts(self, model: ServedModel) -> dict:
        """The model's `state` and, where it failed, its `failure` (cause, attempts, seconds to the next try)."""
        return {"state": self.state_of(model), **({"failure": self.failed[model].describe()} if model in self.failed
                                                  else {})}  # fmt: skip

    def state_of(self, model: ServedModel) -> str:
        """loaded, loading, unloading, failed or unloaded."""
        if model in self.loaded:
            return "loaded"
        for state, models in (("loading", self.loading), ("unloading", self.unloading), ("failed", self.failed)):
            if model in models:
                return state
        return "unloaded"

    # --- loading and unloading -----------------------------------------------------------------------------------
    def check_files(self) -> None:
        """Before serving: each model's files read (not built); a model that fails is reported, not served until
        its folder is mended (checked again with backoff)."""
        for model in self.models:
            if self.check is not None:
                try:
                    self.check(model)
                except Exception as err:
                    self._failed(model, err)

    async def preload(self, models: list[ServedModel]) -> None:
        """Load (and warm) these, one by one, through the line as requests would (within --max_loaded), then say
        the server is ready; a model that fails is reported and the others loaded."""
        self.progress = {"loaded": 0, "of": len(models), "loading": None}
        for model in models:
            self.progress["loading"] = model.name
            try:
                await self.service(model, math.inf)
                self.release(model)
            except ModelFailed:
                pass
            self.progress["loaded"] += 1
        self.progress["loading"] = None
        self.ready = True

    def _load_now(self, model: ServedModel) -> Service:
        # one load at a time: Transformers' from_pretrained patches module construction process-wide while it
        # builds a model on the meta device, and two at once in two threads left one with meta tensors (measured)
        with self.load_lock:
            start = time.monotonic()
            service = self.load(model, self.metrics)
            self.load_seconds = time.monotonic() - start
        return service

    def _loaded(self, model: ServedModel, service: Service) -> None:
        self.loaded[model] = service
        self.metrics.loaded_models.set(len(self.loaded))

    def _failed(self, model: ServedModel, err: BaseException) -> None:
        attempts = self.failed[model].attempts + 1 if model in self.failed else 1
        cause = f"{type(err).__name__}: {err}".strip().splitlines()[0][:300]
        self.failed[model] = LoadFailure(cause, attempts, time.monotonic() + min(300.0, 5.0 * 2 ** (attempts - 1)))
        self.metrics.load_failures.inc()

    async def service(self, model: ServedModel, deadline: float, lines: int = 0, left=None) -> Service:
        """The model's service, marked in use until `release`: at once where it is in memory and open, else after
        waiting in line for its turn (see the class's docstring). Raises ModelLoading past `deadline`
        (time.monotonic()), ModelFailed where the model failed to load (until its backoff ends), Overloaded where
        the `lines` would take the lines waiting, the server's (for a batch or for a model), past --max_queue_lines;
        ConnectionAbortedError as soon as `left()` (awaited beside the wait) says the client has gone: its place in
        line is given up, so a client that hangs up holds no queue and makes no model load."""
        failure = self.failed.get(model)
        if failure is not None and model not in self.turns and failure.retry_at > time.monotonic():
            raise ModelFailed(model, failure)
        if lines and self.depth + lines > self.settings.max_queue_lines:
            self.metrics.shed.inc()
            self.metrics.shed_lines.inc(lines)
            service = self.loaded.get(model)
            raise Overloaded(self.depth, service.retry_after() if service else max(1, min(60, math.ceil(
                self.load_seconds))))  # fmt: skip
        if model in self.loaded and model not in self.closing and model not in self.turns:
            return self._admit(model)
        turn = self.turns.setdefault(model, Turn())
        admitted = asyncio.get_running_loop().create_future()
        turn.waiters.append((admitted, lines))
        self._schedule()
        wait = deadline - time.monotonic()
        watcher = asyncio.ensure_future(left()) if left is not None else None
        try:
            await asyncio.wait({admitted, *([watcher] if watcher else [])}, timeout=None if math.isinf(wait)
                               else max(wait, 0), return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if not admitted.done():
                raise ConnectionAbortedError if watcher is not None and watcher.done() else TimeoutError
            admitted.result()  # ModelFailed where the load failed
        except BaseException as err:
            if admitted.done() and not admitted.cancelled() and admitted.exception() is None:
                self.release(model)  # admitted as the wait ended: the use is given back
            admitted.cancel()
            self._leave(model, admitted)
            if isinstance(err, TimeoutError):
                raise ModelLoading(model, max(1, min(60, math.ceil(self.load_seconds)))) from None
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        return self.loaded[model]

    def _admit(self, model: ServedModel) -> Service:
        self.using[model] = self.using.get(model, 0) + 1
        self.loaded.move_to_end(model)
        return self.loaded[model]

    def _leave(self, model: ServedModel, admitted: asyncio.Future) -> None:
        turn = self.turns.get(model)
        if turn is not None:
            turn.waiters = [(f, n) for f, n in turn.waiters if f is not admitted and not f.done()]
            if not turn.waiters:
                del self.turns[model]
        self._schedule()

    def release(self, model: ServedModel) -> None:
        self.using[model] -= 1
        if not self.using[model] and (self.turns or model in self.closing):
            self._schedule()

    def _schedule(self) -> None:
        """Move the line on (see the class's docstring); called on every change of state, on the event loop."""
        self.closing.clear()  # chosen again below: a model closed for a turn that left is open again
        for model, turn in list(self.turns.items()):
            turn.waiters = [(f, n) for f, n in turn.waiters if not f.done()]
            if not turn.waiters:
                del self.turns[model]
                continue
            if model in self.loaded and model not in self.closing:
                del self.turns[model]
                for admitted, _ in turn.waiters:
                    self._admit(model)
                    admitted.set_result(None)
                continue
            if model in self.loading or model in self.checking or model in self.unloading or model in self.loaded:
                continue  # under way, or closed for an earlier turn: its own comes after that one's
            failure = self.failed.get(model)
            if failure is not None and failure.retry_at > time.monotonic():
                del self.turns[model]
                for admitted, _ in turn.waiters:
                    admitted.set_exception(ModelFailed(model, failure))
                continue
            if self.check is not None and not turn.checked:  # its files read first, before any model is closed
                self._start(self.checking, model, lambda m=model: self.check(m), self._checked)
                continue
            if self._room():
                self._start(self.loading, model, lambda m=model: self._load_now(m), self._finish_load)
                continue
            if self.unloading:
                break  # a slot is on its way (for this turn): one model closed a turn, not one a call
            victim = self._victim(before=model)
            if victim is not None:
                self.closing.add(victim)
                if not self.using.get(victim):
                    self._start_unload(victim)
            break  # one slot at a time, in the line's order: later turns wait for theirs

    def _room(self) -> bool:
        held = len(self.loaded) + len(self.loading) + len(self.unloading)
        return self.max_loaded is None or held < self.max_loaded

    def _victim(self, before: ServedModel) -> ServedModel | None:
        """The model to close for `before`'s turn: not wanted by a turn ahead of it; an idle one first, then the
        least recently used."""
        ahead = list(self.turns)[: list(self.turns).index(before)]
        open_ = [m for m in self.loaded if m not in ahead]
        idle = [m for m in open_ if not self.using.get(m)]
        return (idle or open_ or [None])[0]

    def _start(self, states: dict, model: ServedModel, work: Callable[[], object], done: Callable) -> None:
        future = in_daemon_thread(work, f"vaswani-serve-{model.name}")
        states[model] = future
        future.add_done_callback(lambda finished, m=model: done(m, finished))

    def _finish_load(self, model: ServedModel, done: asyncio.Future) -> None:
        self.loading.pop(model, None)
        if done.exception() is not None:
            self._failed(model, done.exception())
        else:
            self.failed.pop(model, None)
            self._loaded(model, done.result())
            self.metrics.loads.inc()
        self._schedule()

    def _checked(self, model: ServedModel, done: asyncio.Future) -> None:
        self.checking.pop(model, None)
        if done.exception() is not None:
            self._failed(model, done.exception())
        elif model in self.turns:
            self.turns[model].checked = True
        self._schedule()

    def _start_unload(self, model: ServedModel) -> None:
        """Unload in a thread of its own: its worker stopped (waiting for a batch under way: the slot stays
        taken until the memory is free, so --max_loaded holds), the memory given back."""
        held = [self.loaded.pop(model)]  # the only reference: dropped before the memory is collected
        self.closing.discard(model)
        self.metrics.loaded_models.set(len(self.loaded))

        def unload() -> None:
            service = held.pop()
            service.batcher.stop(timeout=None)
            del service
            release_memory()  # the service and its batcher refer to each other: gc.collect() frees them here

        self._start(self.unloading, model, unload, self._finish_unload)

    def _finish_unload(self, model: ServedModel, done: asyncio.Future) -> None:
        self.unloading.pop(model, None)
        if done.exception() is not None:  # only a bug fails an unload: counted, not hidden
            self.metrics.errors.labels(kind="unload").inc()
        self.metrics.unloads.inc()
        self._schedule()

    def stop(self, within: float = 5.0) -> None:
        """Stop every worker: each finishes the batch it has, all together within `within` seconds (their threads
        are daemons: a batch still running then ends with the process)."""
        services = [*self.loaded.values()]
        for service in services:
            service.batcher.stop(timeout=0)
        deadline = time.monotonic() + within
        for service in services:
            service.batcher.worker.join(timeout=max(0.0, deadline - time.monotonic()))

    # --- decoding a route ------------------------------------------------------------------------------------------
    async def decode(self, route: Route, lines: list[str], options: dict, left, deadline: float) -> list:
        """The lines' translations along `route`: a Translation each, in order (see the module's docstring)."""
        if not route.models:
            return [Translation([(line, 0.0)]) for line in lines]
        if len(route.models) == 1:
            return await self._decode_with(route.models[0], lines, options, left, deadline)
        first, second = route.models
        n = options.get("nbest", 1)
        middle = await self._decode_with(first, lines, options, left, deadline)
        candidates = [text for translation in middle for text, _ in translation.nbest]
        final = await self._decode_with(second, candidates, {**options, "nbest": n}, left, deadline)
        composed, at = [], 0
        for translation in middle:
            pool = []
            for _, score in translation.nbest:
                pool += [(text, (score or 0.0) + (later or 0.0)) for text, later in final[at].nbest]
                at += 1
            # the best is the chain's (each model's best: what translating twice gives, whether or not others are
            # asked for); the others by their summed scores, as argos-translate ranks them
            chain, others = pool[0], sorted(pool[1:], key=lambda candidate: -candidate[1])  # stable on ties
            composed.append(Translation([chain, *others][:n], tokens=final[at - len(translation.nbest)].tokens))
        return composed

    async def parse(self, lines: list[str], options: dict, left, deadline: float) -> list:
        """The lines parsed by the parser, loaded in its turn like any model."""
        return await self._decode_with(self.parser_model(), lines, options, left, deadline)

    async def _decode_with(self, model: ServedModel, lines: list[str], options: dict, left, deadline: float):
        service = await self.service(model, deadline, len(lines), left)
        try:
            return await service.decode(lines, options, left, deadline)
        finally:
            self.release(model)

    def describe(self) -> list[dict]:
        """Each model: its folder, pair, whether requests are routed to it by pair, and whether it is in memory."""
        return [{"model": m.name, "source": m.source, "target": m.target, "routed": m.routed,
                 "loaded": m in self.loaded, **self.state_facts(m)}
                for m in self.models]  # fmt: skip
