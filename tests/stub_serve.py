"""`vaswani serve`'s server (server.py: the catalog, the app, uvicorn, the signals) over stub models whose loads,
batches and unloads take the times a test sets, and which fail where it says: the turn-taking, the failures, the
start and the stop are tested through real sockets and real signals in seconds, without building a model.

    python -m tests.stub_serve PORT SPEC_JSON

SPEC: {"models": [{"name", "source", "target", "load_s", "batch_s", "unload_s", "fail": null | "check" | "load" |
"later", "parser": false}], "max_loaded": null, "preload": [names], "settings": {Settings' fields}}. A stub translates
a line into "NAME:line" (a parser's into "(TOP (S line))"); "later": the folder breaks once the server is ready (its
check and its load fail from then on). GET /stub/alive: the stub services still in memory (collected or not)."""

import json
import os
import sys
import threading
import time
import weakref

from fastapi import APIRouter

from vaswani_hf.serving.app import translation_routers
from vaswani_hf.serving.batching import DynamicBatcher
from vaswani_hf.serving.catalog import Catalog, ServedModel
from vaswani_hf.serving.parsing_api import parsing_routers
from vaswani_hf.serving.server import serve
from vaswani_hf.serving.service import Service, Settings, Translation


class StubService(Service):
    """A Service whose model is a sleep: `batch_s` a batch, `unload_s` to stop (as freeing a large model takes)."""

    def __init__(self, spec: dict, settings: Settings, metrics, device_lock) -> None:
        self.spec, self.settings, self.metrics = spec, settings, metrics
        self.model_dir, self.device, self.precision = spec["name"], "cpu", "fp32"
        self.source, self.target = spec["source"], spec["target"]
        self.limit, self.lines_per_second, self.ready = 1000, 0.0, True
        self.decode_batch = self.stub_batch
        self.batcher = DynamicBatcher(self.stub_batch, self.count_tokens, settings.max_batch_tokens,
                                      settings.max_wait_ms, self.on_batch, self.metrics.dropped.inc)  # fmt: skip
        stop, lock = self.batcher.stop, device_lock

        def slow_stop(timeout=60) -> None:
            time.sleep(spec.get("unload_s", 0))
            stop(timeout)

        self.batcher.stop = slow_stop
        self.device_lock = lock

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def stub_batch(self, texts: list[str], options: dict) -> list[Translation]:
        with self.device_lock:
            time.sleep(self.spec.get("batch_s", 0.0))
        if self.spec.get("parser"):
            from vaswani_hf.parsing.parser import ParseResult
            from vaswani_hf.serving.parsing_api import Parsed

            return [Parsed([ParseResult(f"(TOP (S {text}))", -1.0, False)], 1) for text in texts]
        return [Translation([(f"{self.spec['name']}:{text}", -1.0)] * options.get("nbest", 1), 1) for text in texts]


def main(port: int, spec: dict) -> None:
    settings = Settings(**spec.get("settings", {}))
    specs = {model["name"]: model for model in spec["models"]}
    models = [ServedModel(m["name"], m["source"], m["target"], routed=not m.get("parser")) for m in spec["models"]]
    loads = []

    alive = weakref.WeakSet()

    def broken(model: ServedModel, how: str) -> bool:
        fail = specs[model.name].get("fail")
        return fail == how or (fail == "later" and catalog.ready)

    def load(model: ServedModel, metrics) -> StubService:
        loads.append(model.name)
        time.sleep(specs[model.name].get("load_s", 0.0))
        if broken(model, "load"):
            raise RuntimeError(f"{model.name}: the weights do not fit the config (stub)")
        service = StubService(specs[model.name], settings, metrics, catalog.device_lock)
        alive.add(service)
        return service

    def check(model: ServedModel) -> None:
        if broken(model, "check"):
            raise ValueError(f"{model.name}/model.safetensors is not a whole safetensors file (stub)")

    try:
        catalog = Catalog(models, settings, load, spec.get("max_loaded"), check=check)
    except TypeError:  # the catalog before models were checked (to see a test fail before its fix)
        catalog = Catalog(models, settings, load, spec.get("max_loaded"))
    parsers = any(not m.routed for m in models)

    stub = APIRouter()

    @stub.get("/stub/alive")
    async def still_alive() -> list[str]:
        return sorted(service.model_dir for service in alive)

    def routers(catalog_, run, check_key):
        out = translation_routers(catalog_, run, check_key) if catalog_.translators else []
        return [*out, *(parsing_routers(catalog_, run, check_key) if parsers else []), stub]

    preload = [m for m in models if m.name in spec.get("preload", [])]
    threading.current_thread().name = "stub-serve"
    try:
        serve(catalog, "127.0.0.1", port, routers, preload, lambda: print("ready", file=sys.stderr, flush=True))
    except TypeError:  # the server before it opened its port first
        catalog.preload(preload)
        serve(catalog, "127.0.0.1", port, routers)
    print("stopped", file=sys.stderr, flush=True)
    os._exit(0)  # as `vaswani serve` exits


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
