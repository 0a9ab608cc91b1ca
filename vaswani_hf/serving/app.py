"""The HTTP API of `vaswani serve` (FastAPI): LibreTranslate's (`POST /translate`, `GET /languages`), so its
clients work unchanged, and our own (`POST /v1/translate`: n-best, scores, per-request decoding), with `GET /health`
and `GET /metrics` (Prometheus). docs/serving.md shows both with curl.

Every refusal names the problem: 400 (bad JSON or form, unknown language), 422 (a missing or mistyped field,
named), 403 (no valid API key), 413 (text over --max_chars), 503 (not ready, or stopping), 504 (past
--request_timeout), 500 (the model failed on this request's batch; the next batch is served as usual)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, Field, ValidationError

from .service import LANGUAGE_NAMES, Service, TranslationError

API_NAMES = {"/translate": "libretranslate", "/v1/translate": "native"}  # the metrics' api label


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


class LibreRequest(BaseModel):
    """LibreTranslate's `/translate` fields."""

    q: str | list[str]
    source: str = "auto"
    target: str
    format: str = "text"
    api_key: str | None = None
    alternatives: int = Field(default=0, ge=0, le=16)


class NativeRequest(BaseModel):
    """`POST /v1/translate`: texts (each may hold several lines) and the decoding options of this request."""

    texts: list[str] = Field(description="the texts to translate; a text with several lines is translated line by "
                             "line, and its lines come back in order, empty lines kept")  # fmt: skip
    beam_size: int | None = Field(default=None, ge=1, le=64, description="beam width (default: the server's)")
    length_penalty: float | None = Field(default=None, description="GNMT alpha (paper: 0.6)")
    nbest: int = Field(default=1, ge=1, le=16, description="translations per text, best first")
    scores: bool = Field(default=True, description="give each translation's length-penalised log-probability")


class NativeTranslation(BaseModel):
    text: str
    score: float | None = None
    nbest: list[dict] | None = None


class NativeResponse(BaseModel):
    translations: list[NativeTranslation]
    model: str


def create_app(service: Service) -> FastAPI:
    settings = service.settings
    app = FastAPI(title="vaswani serve", description=__doc__.split("\n\n")[0], version="1")
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"])  # fmt: skip

    def refuse(err: ApiError, path: str) -> JSONResponse:
        service.metrics.errors.labels(kind=err.kind).inc()
        service.metrics.requests.labels(api=API_NAMES.get(path, path), status=str(err.status)).inc()
        return JSONResponse({"error": err.message}, status_code=err.status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return refuse(err, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return refuse(ApiError(422, _validation_message(err.errors()), "invalid"), request.url.path)

    @app.middleware("http")
    async def accounting(request: Request, call_next):
        if service.draining and request.url.path not in ("/health", "/metrics"):
            return refuse(ApiError(503, "the server is stopping: send the request to another one", "stopping"),
                          request.url.path)  # fmt: skip
        service.in_flight += 1
        start = time.monotonic()
        try:
            response = await call_next(request)
        finally:
            service.in_flight -= 1
        # the server's own time (W3C Server-Timing), which a client can tell from the network's and its own
        response.headers["Server-Timing"] = f"app;dur={(time.monotonic() - start) * 1000:.1f}"
        return response

    async def run(lines_per_text: list[list[str]], options: dict, request: Request, api: str) -> list[list]:
        if not service.ready:
            raise ApiError(503, "the model is still loading: retry in a moment", "not_ready")
        chars = sum(len(line) for lines in lines_per_text for line in lines)
        if chars > settings.max_chars:
            raise ApiError(413, f"the text has {chars} characters; this server takes at most {settings.max_chars} "
                           "a request (--max_chars): send it in parts", "too_long")  # fmt: skip
        start = time.monotonic()
        flat = [line for lines in lines_per_text for line in lines]
        try:
            done = await service.translate(flat, options, request.is_disconnected)
        except TimeoutError:
            raise ApiError(504, f"no translation within {settings.request_timeout:g} s (--request_timeout): the "
                           "server is busy; retry, or send less text", "timeout") from None  # fmt: skip
        except ConnectionAbortedError:
            raise ApiError(499, "the client left", "disconnected") from None
        except TranslationError as err:
            raise ApiError(500, f"translating this request's batch failed: {err}", "model") from None
        service.metrics.latency.labels(api=api).observe(time.monotonic() - start)
        service.metrics.requests.labels(api=api, status="200").inc()
        out, at = [], 0
        for lines in lines_per_text:
            out.append(done[at : at + len(lines)])
            at += len(lines)
        return out

    @app.post("/translate", summary="LibreTranslate's translate: JSON, a form or the query string")
    async def libre_translate(request: Request) -> JSONResponse:
        fields = await _libre_fields(request)
        try:
            asked = LibreRequest.model_validate(fields)
        except ValidationError as err:
            raise ApiError(422, _validation_message(err.errors()), "invalid") from None
        _check_key(settings.api_keys, asked.api_key, request.headers.get("authorization"))
        if asked.format not in ("text", "html"):
            raise ApiError(400, f"format {asked.format!r}: use text", "invalid")
        if asked.format == "html":
            raise ApiError(400, "format html is not served: this server translates plain text (format text)",
                           "invalid")  # fmt: skip
        source = service.source if asked.source == "auto" else asked.source
        if (source, asked.target) != (service.source, service.target):
            raise ApiError(400, f"{asked.source}->{asked.target} is not served: this model translates "
                           f"{service.source}->{service.target}", "language")  # fmt: skip
        texts = [asked.q] if isinstance(asked.q, str) else asked.q
        nbest = asked.alternatives + 1
        results = await run([_lines(text) for text in texts], {"nbest": nbest} if nbest > 1 else {}, request,
                            "libretranslate")  # fmt: skip
        translated = ["\n".join(t.nbest[0][0] for t in lines) for lines in results]
        answer: dict[str, Any] = {"translatedText": translated[0] if isinstance(asked.q, str) else translated}
        if asked.alternatives:
            alternatives = [[_alternative(lines, k) for k in range(1, nbest)] for lines in results]
            answer["alternatives"] = alternatives[0] if isinstance(asked.q, str) else alternatives
        if asked.source == "auto":
            detected = {"confidence": 100, "language": service.source}
            answer["detectedLanguage"] = detected if isinstance(asked.q, str) else [detected] * len(texts)
        return JSONResponse(answer)

    @app.get("/languages", summary="LibreTranslate's languages: the model's pair")
    async def languages() -> list[dict]:
        return [
            {
                "code": service.source,
                "name": LANGUAGE_NAMES.get(service.source, service.source),
                "targets": [service.target],
            },
            {"code": service.target, "name": LANGUAGE_NAMES.get(service.target, service.target), "targets": []},
        ]

    @app.post("/v1/translate", response_model=NativeResponse, summary="Translate texts, with n-best and scores")
    async def native_translate(asked: NativeRequest, request: Request,
                               authorization: Annotated[str | None, Header()] = None) -> NativeResponse:  # fmt: skip
        _check_key(settings.api_keys, None, authorization)
        options = {k: v for k, v in (("beam_size", asked.beam_size), ("length_penalty", asked.length_penalty))
                   if v is not None}  # fmt: skip
        if asked.nbest > 1:
            options["nbest"] = asked.nbest
        results = await run([_lines(text) for text in asked.texts], options, request, "native")
        translations = []
        for lines in results:
            best = "\n".join(t.nbest[0][0] for t in lines)
            score = sum(t.nbest[0][1] for t in lines) if asked.scores and _scored(lines) else None
            nbest = None
            if asked.nbest > 1:
                nbest = [{"text": _alternative(lines, k), "score": _score_at(lines, k) if asked.scores else None}
                         for k in range(min(len(t.nbest) for t in lines) if lines else 0)]  # fmt: skip
            translations.append(NativeTranslation(text=best, score=score, nbest=nbest))
        return NativeResponse(translations=translations, model=service.model_dir)

    @app.get("/health", summary="ready or not, and what is served")
    async def health() -> JSONResponse:
        state = "stopping" if service.draining else "ready" if service.ready else "loading"
        body = {
            "status": state,
            "model": service.model_dir,
            "languages": [service.source, service.target],
            "device": service.device,
            "precision": service.precision,
            "queue": service.batcher.depth,
        }
        return JSONResponse(body, status_code=200 if state == "ready" else 503)

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> PlainTextResponse:
        service.metrics.queue.set(service.batcher.depth)
        return PlainTextResponse(generate_latest(service.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")  # fmt: skip

    return app


def _lines(text: str) -> list[str]:
    """A text's lines as `vaswani translate` reads a file's: split at line ends, a carriage return dropped."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _scored(lines: list) -> bool:
    return all(t.nbest[0][1] is not None for t in lines)


def _alternative(lines: list, k: int) -> str:
    """The text's k-th candidate, line by line (a line with fewer candidates gives its best)."""
    return "\n".join(t.nbest[min(k, len(t.nbest) - 1)][0] for t in lines)


def _score_at(lines: list, k: int) -> float | None:
    scores = [t.nbest[min(k, len(t.nbest) - 1)][1] for t in lines]
    return sum(scores) if lines and all(s is not None for s in scores) else None


async def _libre_fields(request: Request) -> dict:
    """The fields of a LibreTranslate request, from its JSON body, its form or its query string (as LibreTranslate
    reads them); `q` may repeat in a form or query string."""
    fields: dict[str, Any] = dict(request.query_params)
    if request.query_params.getlist("q")[1:]:
        fields["q"] = request.query_params.getlist("q")
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, UnicodeDecodeError) as err:
            raise ApiError(400, f"the body is not valid JSON ({err})", "invalid") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the JSON body must be an object with q, source and target", "invalid")
        fields.update(body)
    elif kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        fields.update({key: value for key, value in form.items()})
        if form.getlist("q")[1:]:
            fields["q"] = form.getlist("q")
    return fields


def _check_key(keys: frozenset[str], given: str | None, authorization: str | None) -> None:
    if not keys:
        return
    bearer = authorization.removeprefix("Bearer ").strip() if authorization and authorization.startswith("Bearer ") \
        else None  # fmt: skip
    if (given or bearer) not in keys:
        raise ApiError(403, "a valid API key is needed: give api_key (LibreTranslate) or an 'Authorization: Bearer "
                       "KEY' header", "forbidden")  # fmt: skip


def _validation_message(errors: list[dict]) -> str:
    """Pydantic's errors as one sentence naming each field."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "the request"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)
