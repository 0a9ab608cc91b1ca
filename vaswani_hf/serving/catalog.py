"""Many models behind one URL, as a LibreTranslate instance serves every pair it has installed: each model's pair,
the routes between languages, and the models in memory.

A route is direct (one model), composed through a pivot language both sides share (two models: the first model's
best translated by the second, as translating twice gives it; n-best: the first model's n candidates, the
second's n for each, scores summed, the best kept, as argos-translate composes), or the identity (every served
language translates to itself: the text comes back as it is). Where several pivots exist, the one whose weaker
model scored best on its held-out data (its training facts' BLEU) is taken.

Models load when first asked for and, past `--max_loaded`, the least recently used one that no request is using is
unloaded (LibreTranslate loads every model it meets and never unloads one: its users saw memory grow until the
process was killed). A request for a model being loaded waits for the load, within its time.

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
from dataclasses import dataclass
from pathlib import Path

from .service import LANGUAGE_NAMES, Metrics, Service, Settings, Translation


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

    for (source, pivot), first in direct.items():
        for (middle, target), second in direct.items():
            if middle != pivot or source == target or (source, target) in direct:
                continue
            known = routes.get((source, target))
            if known is None or strength((first, second)) > strength(known.models):
                routes[(source, target)] = Route(source, target, (first, second))
    return routes


def release_memory() -> None:
    """Give freed memory back to the system after a model is unloaded (glibc keeps it otherwise)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Catalog:
    """The models served, their routes, the ones in memory, and the server's state (see the module's docstring).

    `load(model, metrics)` builds a model's warmed `Service` (in a worker thread when a request asks for it), giving
    it `device_lock`, so that the models take turns on the device; `device` and `precision` say where and how the
    models run (`load` sets them)."""

    def __init__(self, models: list[ServedModel], settings: Settings, load: Callable[[ServedModel, Metrics], Service],
                 max_loaded: int | None = None) -> None:  # fmt: skip
        check_models(models)
        self.models, self.settings, self.load, self.max_loaded = models, settings, load, max_loaded
        self.metrics = Metrics()
        self.routes = plan_routes(models)
        self.loaded: OrderedDict[ServedModel, Service] = OrderedDict()  # least recently used first
        self.loading: dict[ServedModel, asyncio.Future] = {}
        self.using: dict[ServedModel, int] = {}
        self.pinned = {m for m in models if not m.routed}  # a parser stays loaded: its routes are its own
        self.ready = self.draining = False
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
        return sum(service.batcher.depth for service in self.loaded.values())

    @property
    def translators(self) -> list[ServedModel]:
        return [m for m in self.models if m.routed]

    def parser(self) -> Service | None:
        return next((self.loaded[m] for m in self.pinned if m in self.loaded), None)

    def sources(self) -> list[str]:
        """Every served language, in the order the models name them (the first model's source first)."""
        return list(dict.fromkeys(code for m in self.translators for code in (m.source, m.target)))

    def targets_of(self, source: str) -> list[str]:
        """What `source` translates to: the models' targets, then those composed, then itself."""
        reached = [t for (s, t), route in self.routes.items() if s == source and len(route.models) == 1]
        composed = sorted(t for (s, t), route in self.routes.items() if s == source and len(route.models) == 2)
        return [*reached, *composed, *([source] if (source, source) in self.routes else [])]

    def route(self, source: str, target: str) -> Route:
        if (source, target) in self.routes:
            return self.routes[(source, target)]
        served = set(self.sources())
        unknown = next((code for code in (source, target) if code not in served), None)
        raise NoRoute(source, target, unknown)

    def default_pair(self) -> tuple[str, str]:
        first = (self.translators or self.models)[0]
        return first.source, first.target

    # --- loading ---------------------------------------------------------------------------------------------------
    def preload(self, models: list[ServedModel]) -> None:
        """Load (and warm) these before the server says it is ready; the parser always."""
        for model in [*self.pinned, *models]:
            if model not in self.loaded:
                self._loaded(model, self._load_now(model))
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

    def _evict(self) -> bool:
        """Unload the least recently used model no request is using; False where every one is in use."""
        for model in list(self.loaded):
            if model not in self.pinned and not self.using.get(model):
                service = self.loaded.pop(model)
                service.batcher.stop()
                del service
                release_memory()
                self.metrics.loaded_models.set(len(self.loaded))
                return True
        return False

    async def service(self, model: ServedModel, deadline: float) -> Service:
        """The model's service, loaded if needed (waiting for a load under way), marked in use until `release`:
        from the moment it is asked for, so a model just loaded for a request is not unloaded before it is used.
        Raises ModelLoading past `deadline` (time.monotonic())."""
        self.using[model] = self.using.get(model, 0) + 1
        try:
            while model not in self.loaded:
                pending = self.loading.get(model)
                if pending is None:
                    full = self.max_loaded is not None and len(self.loaded) + len(self.loading) >= self.max_loaded
                    if full and not self._evict():
                        await self._wait(model, deadline, asyncio.sleep(0.05))  # every loaded model is in use
                        continue
                    pending = asyncio.ensure_future(asyncio.to_thread(self._load_now, model))
                    self.loading[model] = pending
                    pending.add_done_callback(lambda done, m=model: self._finish_load(m, done))
                await self._wait(model, deadline, asyncio.shield(pending))
        except BaseException:
            self.release(model)
            raise
        self.loaded.move_to_end(model)
        return self.loaded[model]

    def _finish_load(self, model: ServedModel, done: asyncio.Future) -> None:
        self.loading.pop(model, None)
        if not done.cancelled() and done.exception() is None:
            self._loaded(model, done.result())

    async def _wait(self, model: ServedModel, deadline: float, awaitable) -> None:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            await asyncio.wait_for(awaitable, left)
        except TimeoutError:
            raise ModelLoading(model, max(1, min(60, math.ceil(self.load_seconds)))) from None

    def release(self, model: ServedModel) -> None:
        self.using[model] -= 1

    def stop(self) -> None:
        for service in self.loaded.values():
            service.batcher.stop()

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

    async def _decode_with(self, model: ServedModel, lines: list[str], options: dict, left, deadline: float):
        service = await self.service(model, deadline)
        try:
            return await service.decode(lines, options, left)
        finally:
            self.release(model)

    def describe(self) -> list[dict]:
        """Each model: its folder, pair, whether requests are routed to it by pair, and whether it is in memory."""
        return [{"model": m.name, "source": m.source, "target": m.target, "routed": m.routed,
                 "loaded": m in self.loaded} for m in self.models]  # fmt: skip
