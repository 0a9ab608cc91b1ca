"""One model `vaswani serve` serves: the loaded model behind its dynamic batcher, its language pair, and the
metrics it reports into (the server's, catalog.py: many models behind one URL)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..interop.convert.fairseq import fairseq_length
from ..model.alignment_vaswani import forced_attentions
from ..translation.batch_workers import asked_workers, share_of_a_batch
from ..translation.inference import search_settings, translate_nbest
from ..translation.source_lines import source_limit
from .batching import BatchStats, DynamicBatcher, Line
from .guard import each, within
from .language_id import identifier

# the options a request may set, and what `generate()` calls them
DECODING_OPTIONS = {"beam_size": "num_beams", "length_penalty": "length_penalty"}
LANGUAGE_NAMES = {"ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fr": "French",
                  "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
                  "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "zh": "Chinese"}  # fmt: skip


class TranslationError(Exception):
    """A request's text could not be translated or parsed (a batch failed in the model)."""


class Overloaded(Exception):
    """The queue holds as many lines as it may (--max_queue_lines): retry after `retry_after` seconds."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is over its limit ({waiting} lines waiting, --max_queue_lines): retry in "
                         f"{retry_after} s")  # fmt: skip
        self.retry_after = retry_after


class LineTooLong(ValueError):
    """A line over the model's source limit, with --long-lines error: refused before it is queued."""


@dataclass
class Translation:
    """One line's n-best, best first: (text, score); `tokens`, the best one's output token count (for the metrics)."""

    nbest: list[tuple[str, float | None]]
    tokens: int = 0
    attention: dict | None = None  # the best one's cross-attention, when the request asked for it


@dataclass
class Settings:
    """`vaswani serve`'s options, as the app reads them."""

    max_batch_tokens: int = 4096
    max_wait_ms: float = 10.0
    max_chars: int = 5000
    request_timeout: float = 60.0
    drain_seconds: float = 20.0  # after SIGTERM; the whole stop stays within 25 s (server.py)
    api_keys: frozenset[str] = frozenset()
    key_limits: dict = field(default_factory=dict)  # key -> (requests a minute, characters a request), from --api_keys
    sentences: bool = True  # a line's sentences decoded one by one (sentences.py); --sentences off: lines whole
    cors_origins: tuple[str, ...] = ()
    long_lines: str = "cut"
    decoding: dict = field(default_factory=dict)  # the command's --beam-size etc., as generate() keywords
    # bounds checked before any work (docs/serving.md, "Limits")
    max_body_bytes: int = 1_000_000
    max_lines: int = 200  # lines a request, over all its texts
    batch_limit: int = 64  # texts in a list (LibreTranslate's --batch-limit)
    max_queue_lines: int = 2048  # lines waiting for a batch; past it requests are refused with Retry-After
    max_client_lines: int = 0  # lines one client may have in flight (0: half the queue, at least one request's)
    max_connections: int = 1000  # connections and requests at once (uvicorn's limit_concurrency: 503 past it)
    header_timeout: float = 10.0  # seconds a connection may take to send a request's headers
    max_header_bytes: int = 65536  # a request's line and headers, in bytes (431 past it; waitress: 256 KiB)
    max_headers: int = 100  # header fields a request (431 past it; Apache's LimitRequestFields)
    body_timeout: float = 10.0  # seconds a body may pause between two chunks (and 6 times this in all)
    forwarded_allow_ips: str | None = None  # proxies whose X-Forwarded-For names the client (uvicorn's; None: its own)
    max_beam: int = 16
    max_nbest: int = 8
    open_metrics: bool = False  # /metrics without a key even when --api_keys is given
    detect_threshold: float = 0.9  # the identifier's confidence past which `source: auto` refuses another language
    detect_min_chars: int = 20  # shorter texts are translated whatever the identifier says


class Metrics:
    """The Prometheus metrics of one server (its own registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("vaswani_requests", "requests answered, by API and status", ["api", "status"],
                                registry=r)  # fmt: skip
        self.shed = Counter("vaswani_shed_requests", "requests refused at once because the queue was full",
                            registry=r)  # fmt: skip
        self.shed_lines = Counter("vaswani_shed_lines", "lines of the requests refused for a full queue", registry=r)
        self.dropped = Counter("vaswani_dropped_lines", "lines dropped before a batch: their client left or their "
                               "time ran out", registry=r)  # fmt: skip
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
        self.loaded_models = Gauge("vaswani_loaded_models", "models in memory (--max_loaded)", registry=r)
        self.loads = Counter("vaswani_model_loads", "models loaded (and warmed)", registry=r)
        self.unloads = Counter("vaswani_model_unloads", "models unloaded for others (--max_loaded)", registry=r)
        self.load_failures = Counter("vaswani_model_load_failures", "models that failed to load, or whose files "
                                     "failed their check", registry=r)  # fmt: skip
        self.client_shed = Counter("vaswani_client_shed_requests", "requests refused because their client already "
                                   "had its share of the queue waiting (--max_client_lines)", registry=r)  # fmt: skip

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
    """The model, its batcher and the server's state. `decode_batch(service, lines, options)` decodes one batch
    and returns a result a line, each with `tokens` (output tokens, for the metrics); the caller gives the one its
    model's routes expect (a parser's: `parsing_api.parse_batch`); by default, `translate_batch`."""

    def __init__(self, model, tokenizer, settings: Settings, model_dir: str, device: str, precision: str,
                 languages: tuple[str, str],
                 decode_batch: Callable[[Service, list[str], dict], list] | None = None,
                 metrics: Metrics | None = None, device_lock: threading.Lock | None = None) -> None:  # fmt: skip
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.model_dir, self.device, self.precision = model_dir, device, precision
        self.source, self.target = languages
        self.decode_batch = partial(decode_batch, self) if decode_batch else self.translate_batch
        if device_lock is not None:  # the server's models take turns on the device: one batch at a time, each
            self.decode_batch = partial(_holding, device_lock, self.decode_batch)  # model's queue filling meanwhile
        self.metrics = metrics or Metrics()  # a server's models share one registry
        self.ready = False  # warmed up (the server's own state is its catalog's)
        self.limit = source_limit(model, tokenizer)
        asked_workers()  # a bad VASWANI_DECODING_WORKERS stops the load with its message, not every batch after it
        self.lines_per_second = 0.0  # the worker's pace, for Retry-After
        self.batcher = DynamicBatcher(self.decode_batch, self.count_tokens, settings.max_batch_tokens,
                                      settings.max_wait_ms, self.on_batch, self.metrics.dropped.inc)  # fmt: skip

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"]) if text.strip() else 0

    def on_batch(self, stats: BatchStats) -> None:
        self.metrics.batch(stats)
        if stats.seconds > 0:
            pace = stats.lines / stats.seconds
            self.lines_per_second = pace if not self.lines_per_second else 0.8 * self.lines_per_second + 0.2 * pace

    def retry_after(self) -> int:
        """Seconds until the queue has room again, at the worker's pace (1 to 60)."""
        if not self.lines_per_second:
            return 1
        return max(1, min(60, math.ceil(self.batcher.depth / self.lines_per_second)))

    def translate_batch(self, texts: list[str], options: dict) -> list[Translation]:
        """One batch, one call of what `vaswani translate` runs (`translate_nbest`)."""
        options = dict(options)
        nbest, attention = options.pop("nbest", 1), options.pop("attention", False)
        decoding = {**self.settings.decoding, **{DECODING_OPTIONS[k]: v for k, v in options.items()}}
        decoding = fairseq_length(getattr(self.model, "config", None), decoding)  # `--decoding fairseq`'s cap
        # the batch's lines in a share per decoding worker, side by side (translation/batch_workers.py)
        beams, _ = search_settings(self.model, nbest, decoding)
        results = translate_nbest(self.model, self.tokenizer, texts, nbest=nbest,
                                  batch_size=share_of_a_batch(self.model, len(texts), beams), progress=False,
                                  long_lines=self.settings.long_lines, **decoding)  # fmt: skip
        translations = [Translation([(text, score) for text, score, *_ in result],
                                    len(self.tokenizer(result[0][0])["input_ids"]) if result[0][0] else 0)
                        for result in results]  # fmt: skip
        if attention:
            for source, translation in zip(texts, translations, strict=True):
                translation.attention = cross_attention(self.model, self.tokenizer, source, translation.nbest[0][0])
        return translations

    def warm_up(self) -> None:
        """The first batch builds the kernels and the caches: done before the server says it is ready."""
        self.decode_batch(["warm up"], {})
        identifier()  # the language identifier's model, loaded before the first /detect
        self.ready = True

    async def decode(self, lines: list[str], options: dict, left, deadline: float | None = None) -> list:
        """The lines' results (`decode_batch`'s: translations, or a parser's trees), in order. `left()` is awaited
        beside them and returns when the client has gone (the request's receive channel). Raises Overloaded, before
        queueing anything, when the queue is full; LineTooLong for a line over the model's limit with --long-lines
        error; TimeoutError past `deadline` (the request's, from its arrival: one bound across its loads and batch
        queues; None: --request_timeout from now); ConnectionAbortedError as soon as the client leaves (its
        waiting lines are dropped either way); TranslationError when its line failed in the model."""
        deadline = time.monotonic() + self.settings.request_timeout if deadline is None else deadline
        # a megabyte of text is seconds of tokenizing: off the event loop, where /health and the other pairs wait,
        # within the request's time (none of its lines tokenized past it)
        tokens = (await within(deadline, each, self.count_tokens, lines) if sum(map(len, lines)) > 20_000
                  else [self.count_tokens(line) for line in lines])  # fmt: skip
        if self.settings.long_lines == "error":
            for number, count in enumerate(tokens, 1):
                if count > self.limit:
                    raise LineTooLong(f"line {number} has {count} tokens, but the model reads at most {self.limit}: "
                                      "shorten it (this server refuses long lines: --long-lines error)")  # fmt: skip
        queued = self.batcher.submit(lines, options, asyncio.get_running_loop(), tokens,
                                     self.settings.max_queue_lines)  # fmt: skip
        if queued is None:
            self.metrics.shed.inc()
            self.metrics.shed_lines.inc(len(lines))
            raise Overloaded(self.batcher.depth, self.retry_after())
        self.metrics.queue.set(self.batcher.depth)
        watcher = asyncio.ensure_future(left())
        try:
            pending = {line.future for line in queued}
            while pending:
                done, _ = await asyncio.wait({*pending, watcher}, timeout=self._left(deadline),
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if watcher in done:
                    raise ConnectionAbortedError
                if not done:
                    raise TimeoutError
                pending -= done
            return [_result(line) for line in queued]
        finally:
            self.batcher.abandon(queued)
            watcher.cancel()
            for line in queued:
                line.future.cancel()
            self.metrics.queue.set(self.batcher.depth)

    @staticmethod
    def _left(deadline: float) -> float:
        """Seconds left of the request's time."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left


def _holding(lock: threading.Lock, decode_batch: Callable, *args):
    with lock:
        return decode_batch(*args)


def cross_attention(model, tokenizer, source: str, translation: str) -> dict:
    """How each token of `translation` attended to the tokens of `source` when the model wrote it: the last decoder
    layer's encoder-decoder attention averaged over its heads, by forced decoding (rows: the target tokens, each
    row summing to 1). An empty line gives empty lists."""
    if not source.strip():
        return {"source_tokens": [], "target_tokens": [], "weights": []}
    batch = tokenizer([source], return_tensors="pt").to(model.device)
    labels = tokenizer(text_target=[translation], return_tensors="pt").input_ids.to(model.device)
    start = torch.full_like(labels[:, :1], model.config.decoder_start_token_id)
    with torch.no_grad():
        outputs = forced_attentions(model, **batch, decoder_input_ids=torch.cat([start, labels[:, :-1]], 1))
    weights = outputs.cross_attentions[-1][0].float().mean(0)
    return {"source_tokens": tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist()),
            "target_tokens": tokenizer.convert_ids_to_tokens(labels[0].tolist()),
            "weights": [[round(w, 4) for w in row] for row in weights.cpu().tolist()]}  # fmt: skip


def _result(line: Line):
    try:
        return line.future.result()
    except RuntimeError as err:
        raise TranslationError(str(err)) from None


def model_languages(model_dir: str, source: str | None, target: str | None) -> tuple[str, str]:
    """The pair a model translates: as given, else from its training facts (`vaswani train` and `vaswani convert`
    write them), else from its model card's `language` list of two (source first, as Hub translation cards list
    them)."""
    known = saved_facts(model_dir).get("data") or {}
    card = card_languages(model_dir)
    source, target = source or known.get("src") or card[0], target or known.get("tgt") or card[1]
    if not source or not target:
        raise ValueError(f"{model_dir} does not say which languages it translates (no src/tgt in its "
                         "training_facts.json, no two languages in its README.md card): give --source and --target, "
                         "e.g. --source en --target de (with one model), or write them in its training_facts.json."
                         )  # fmt: skip
    return source, target


def card_languages(model_dir: str) -> tuple[str | None, str | None]:
    """The model card's (README.md's metadata) two languages, or (None, None)."""
    path = Path(model_dir) / "README.md"
    if not path.is_file():
        return None, None
    from huggingface_hub import ModelCard

    try:
        languages = ModelCard.load(path).data.language
    except Exception:  # a card that does not parse says nothing
        return None, None
    return tuple(languages) if isinstance(languages, list) and len(languages) == 2 else (None, None)


def check_model_files(model_dir: str) -> None:
    """Read a model folder's files as its load will, without building the model: the load's own check of the folder
    (config.json of this model type, the weights, the tokenizer), then each safetensors file's header whole, its
    tensors within the file and each of their shapes the one config.json makes (the model is laid out on the meta
    device: no memory). Raises ValueError naming the file; run before a served model is unloaded to make room for
    this one, so that a load that will fail never unloads another model."""
    import torch
    from safetensors import safe_open

    from ..model.configuration_vaswani import VaswaniConfig
    from ..model.modeling_vaswani import VaswaniForConditionalGeneration
    from ..translation.inference import check_model_folder

    folder = Path(model_dir)
    try:
        check_model_folder(folder, tokenizer=True)
        config = VaswaniConfig.from_pretrained(folder)
        with torch.device("meta"):
            expected = {
                name: tuple(t.shape) for name, t in VaswaniForConditionalGeneration(config).state_dict().items()
            }
    except (OSError, ValueError, TypeError) as err:  # (FileNotFoundError is an OSError)
        raise ValueError(str(err)) from None
    found = 0
    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt") as opened:
                shapes = {name: tuple(opened.get_slice(name).get_shape()) for name in opened.keys()}
        except Exception as err:
            raise ValueError(f"{weights} is not a whole safetensors file ({err})") from None
        for name, shape in shapes.items():
            if name in expected and shape != expected[name]:
                raise ValueError(f"{weights}: the weights do not fit config.json ({name} is {list(shape)}, the config "
                                 f"makes it {list(expected[name])}): the config was edited or belongs to another "
                                 "model")  # fmt: skip
            found += name in expected
    if not found:
        raise ValueError(f"{folder}: its safetensors files hold none of this model's weights")


def saved_facts(model_dir: str) -> dict:
    """The model's training_facts.json (`vaswani train` writes it), or {} where there is none to read."""
    path = Path(model_dir) / "training_facts.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
