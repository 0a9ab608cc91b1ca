"""What `vaswani serve` serves: one loaded model behind the dynamic batcher, its language pair, its metrics, and
the server's state (ready, draining, requests in flight)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..translation.inference import translate_nbest
from .batching import BatchStats, DynamicBatcher, Line

# the options a request may set, and what `generate()` calls them
DECODING_OPTIONS = {"beam_size": "num_beams", "length_penalty": "length_penalty"}
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fr": "French",
                  "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "zh": "Chinese"}  # fmt: skip


class TranslationError(Exception):
    """A request's text could not be translated (a batch failed in the model)."""


@dataclass
class Translation:
    """One line's n-best, best first: (text, score); `tokens`, the best one's output token count (for the metrics)."""

    nbest: list[tuple[str, float | None]]
    tokens: int = 0


@dataclass
class Settings:
    """`vaswani serve`'s options, as the app reads them."""

    max_batch_tokens: int = 4096
    max_wait_ms: float = 10.0
    max_chars: int = 5000
    request_timeout: float = 60.0
    drain_seconds: float = 30.0
    api_keys: frozenset[str] = frozenset()
    cors_origins: tuple[str, ...] = ()
    long_lines: str = "cut"
    decoding: dict = field(default_factory=dict)  # the command's --beam-size etc., as generate() keywords


class Metrics:
    """The Prometheus metrics of one server (its own registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vaswani_requests", "requests answered, by API and status", ["api", "status"],
                                registry=r)  # fmt: skip
        self.errors = Counter("vaswani_errors", "requests refused or failed, by kind", ["kind"], registry=r)
        self.queue = Gauge("vaswani_queue_lines", "lines waiting for a batch", registry=r)
        self.batch_lines = Histogram("vaswani_batch_lines", "lines per batch", registry=r,
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))  # fmt: skip
        self.batch_tokens = Histogram("vaswani_batch_tokens", "padded source tokens per batch", registry=r,
                                      buckets=(16, 64, 256, 1024, 4096, 16384))  # fmt: skip
        self.batch_seconds = Histogram("vaswani_batch_seconds", "seconds per batch in the model", registry=r)
        self.slowest_batch = Gauge("vaswani_slowest_batch_seconds", "the slowest batch so far, seconds", registry=r)
        self.slowest = 0.0
        self.latency = Histogram("vaswani_request_seconds", "seconds from a request to its answer", ["api"],
                                 registry=r)  # fmt: skip
        self.output_tokens = Counter("vaswani_output_tokens", "target tokens produced (rate(): tokens/s)", registry=r)

    def batch(self, stats: BatchStats) -> None:
        self.batch_lines.observe(stats.lines)
        self.batch_tokens.observe(stats.tokens)
        self.batch_seconds.observe(stats.seconds)
        self.slowest = max(self.slowest, stats.seconds)
        self.slowest_batch.set(self.slowest)
        self.output_tokens.inc(stats.output_tokens)
        if stats.error:
            self.errors.labels(kind=f"batch:{stats.error}").inc()


class Service:
    """The model, its batcher and the server's state."""

    def __init__(self, model, tokenizer, settings: Settings, model_dir: str, device: str, precision: str,
                 languages: tuple[str, str]) -> None:  # fmt: skip
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.model_dir, self.device, self.precision = model_dir, device, precision
        self.source, self.target = languages
        self.metrics = Metrics()
        self.ready = self.draining = False
        self.in_flight = 0
        self.batcher = DynamicBatcher(self.translate_batch, self.count_tokens, settings.max_batch_tokens,
                                      settings.max_wait_ms, self.metrics.batch)  # fmt: skip

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"]) if text.strip() else 0

    def translate_batch(self, texts: list[str], options: dict) -> list[Translation]:
        """One batch, one call of what `vaswani translate` runs (`translate_nbest`)."""
        options = dict(options)
        nbest = options.pop("nbest", 1)
        decoding = {**self.settings.decoding, **{DECODING_OPTIONS[k]: v for k, v in options.items()}}
        results = translate_nbest(self.model, self.tokenizer, texts, nbest=nbest, batch_size=len(texts),
                                  progress=False, long_lines=self.settings.long_lines, **decoding)  # fmt: skip
        return [Translation([(text, score) for text, score, *_ in result],
                            len(self.tokenizer(result[0][0])["input_ids"]) if result[0][0] else 0)
                for result in results]  # fmt: skip

    def warm_up(self) -> None:
        """The first batch builds the kernels and the caches: done before the server says it is ready."""
        self.translate_batch(["warm up"], {})
        self.ready = True

    async def translate(self, lines: list[str], options: dict, disconnected) -> list[Translation]:
        """The lines' translations, in order. Raises TimeoutError past the request timeout, ConnectionAbortedError
        when `disconnected()` says the client left (its waiting lines are dropped either way), TranslationError when
        a batch failed."""
        queued = self.batcher.submit(lines, options, asyncio.get_running_loop())
        self.metrics.queue.set(self.batcher.depth)
        deadline = time.monotonic() + self.settings.request_timeout
        try:
            pending = {line.future for line in queued}
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                _, pending = await asyncio.wait(pending, timeout=min(left, 0.25))
                if pending and await disconnected():
                    raise ConnectionAbortedError
            return [_result(line) for line in queued]
        finally:
            self.batcher.abandon(queued)
            for line in queued:
                line.future.cancel()
            self.metrics.queue.set(self.batcher.depth)


def _result(line: Line) -> Translation:
    try:
        return line.future.result()
    except RuntimeError as err:
        raise TranslationError(str(err)) from None


def model_languages(model_dir: str, source: str | None, target: str | None) -> tuple[str, str]:
    """The pair a model translates: as given, else from its training facts (`vaswani train` writes them)."""
    facts = Path(model_dir) / "training_facts.json"
    known = {}
    if facts.is_file():
        try:
            known = json.loads(facts.read_text()).get("data", {})
        except (OSError, ValueError):
            known = {}
    source, target = source or known.get("src"), target or known.get("tgt")
    if not source or not target:
        raise ValueError(f"{model_dir} does not say which languages it translates (no src/tgt in its "
                         "training_facts.json): give --source and --target, e.g. --source en --target de.")  # fmt: skip
    return source, target
