"""The HTTP API of `vaswani serve` (FastAPI): the routes its caller gives, with `GET /health`, `GET /metrics`
(Prometheus) and one error handling for all. Translation models' are LibreTranslate's (libretranslate.py), so the
apps written for it work unchanged, and our own (native.py: n-best, scores, per-request decoding, cross-attention,
the page at `/`); a parser's are `POST /parse` (parsing_api.py). docs/serving.md shows them with curl.

The app never asks what a model is: `create_app(catalog, routers)` takes a function of (catalog, run, check_key)
giving the routers (the served tasks' `serving` name them), and `run` serves any request's lines along a route
(catalog.py: direct, composed or the identity) within the bounds, a line's sentences decoded one by one.

Every refusal is `{"error": message}`, naming the problem and its limit, with the status each API's clients expect
(docs/serving.md, "Errors"); 429 and 503 carry Retry-After."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException

from .catalog import Catalog, ModelFailed, ModelLoading, Route
from .guard import (
    ApiError,
    KeyLimits,
    RequestGuard,
    api_of,
    check_chars,
    check_lines,
    check_queue,
    deadline_of,
    disconnected,
    too_slow,
    within,
)
from .libretranslate import libretranslate_router
from .native import native_router
from .sentences import flatten, joined, split
from .service import LineTooLong, Overloaded, Service, TranslationError
from .shares import ClientShares

Routers = Callable[..., list[APIRouter]]  # (catalog, run, check_key) -> the routes the models are served with


def translation_routers(catalog: Catalog, run, check_key) -> list[APIRouter]:
    """Translation models' routes: LibreTranslate's API and the native one (with the page)."""
    return [libretranslate_router(catalog, run, check_key), native_router(catalog, run, check_key)]


def create_app(catalog: Catalog | Service, routers: Routers | None = None) -> FastAPI:
    """The app serving the catalog's models with the routes `routers(catalog, run, check_key)` gives (default:
    translation models'), beside /health and /metrics. A `Service` alone is served as a catalog of one model."""
    if isinstance(catalog, Service):
        catalog = Catalog.of(catalog, routed=routers in (None, translation_routers))
    service = catalog  # the server's state: settings, metrics, readiness, draining
    settings = service.settings
    limits = KeyLimits(settings.key_limits)
    shares = ClientShares(settings.max_client_lines or max(settings.max_queue_lines // 2, settings.max_lines))
    app = FastAPI(title="vaswani serve", description=__doc__.split("\n\n")[0], version="1", docs_url="/docs",
                  openapi_url="/openapi.json")  # fmt: skip
    # the guard first, CORS outside it: a refusal while draining or of a body too large carries CORS headers too
    app.add_middleware(RequestGuard, service=service)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["Retry-After", "Server-Timing"])  # fmt: skip

    def refuse(err: ApiError, path: str) -> JSONResponse:
        service.metrics.errors.labels(kind=err.kind).inc()
        service.metrics.requests.labels(api=api_of(path), status=str(err.status)).inc()
        return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return refuse(err, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        status = 400 if api_of(request.url.path) == "libretranslate" else 422
        return refuse(ApiError(status, _validation_message(err.errors()), "invalid"), request.url.path)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        # 404 and 405 in the API's shape, not Starlette's {"detail": ...}
        message = {404: f"not found: {request.url.path}", 405: f"{request.method} is not allowed on "
                   f"{request.url.path}"}.get(err.status_code, str(err.detail))  # fmt: skip
        return refuse(ApiError(err.status_code, message, str(err.status_code), dict(err.headers or {})),
                      request.url.path)  # fmt: skip

    def check_key(given: str | None, authorization: str | None) -> int | None:
        """No keys configured: every request passes. Else LibreTranslate's rule: a missing key is 400, a wrong one
        403; the key may also come as 'Authorization: Bearer KEY'. A key's requests per minute are counted here (429
        with Retry-After past them); its characters per request (None: the server's) are returned for `run`."""
        if not settings.api_keys:
            return None
        # the scheme is case-insensitive (RFC 9110, 11.1): "bearer KEY" as well
        bearer = authorization[7:].strip() if authorization and authorization[:7].lower() == "bearer " else None
        key = given or bearer
        if not key:
            # the words Dialect matches to tell a user that the server wants a key (LibreTranslate's older wording)
            raise ApiError(400, "Please contact the server operator to obtain an API key", "no_key")
        if key not in settings.api_keys:
            raise ApiError(403, "Invalid API key", "forbidden")
        return limits.admit(key)

    async def run(lines_per_text: list[list[str]], options: dict, request: Request, api: str,
                  chars: int | None = None, noun: str = "translation", doing: str = "translating",
                  route: Route | None = None, char_limit: int | None = None) -> list[list]:  # fmt: skip
        """Decode a request's texts (each a list of lines) along `route` (None: the parser), within the bounds,
        statuses as `api`'s clients expect them. `chars`: the request's characters as its client sent them,
        where its lines are not its text (a parse's escaped words); `noun` and `doing` name the work in errors;
        `char_limit`: the key's characters per request, where it has its own."""
        libre = api == "libretranslate"
        if not service.ready:
            raise ApiError(503, "the model is still loading: retry in a moment", "not_ready", {"Retry-After": "5"})
        check_lines(settings, libre, sum(len(text) for text in lines_per_text))
        chars = sum(len(line) for text in lines_per_text for line in text) if chars is None else chars
        check_chars(settings, libre, chars, char_limit)
        flat = [line for text in lines_per_text for line in text]
        # the lines the model is sent (each line's sentences, split off the loop) are counted before anything is
        # queued: over --max_lines, or more than the queue can ever hold (through a pivot, the second model is sent
        # the first's candidates), the request is refused for good, never told to retry
        pieces = None
        deadline = deadline_of(request, settings.request_timeout)
        if route is not None and route.models and settings.sentences:
            try:
                pieces = await within(deadline, split, flat, route.source)
            except TimeoutError:
                raise too_slow(settings.request_timeout, noun) from None
        model_lines = sum(map(len, pieces)) if pieces is not None else len(flat)
        check_lines(settings, libre, model_lines, "sentences, each a line for the model")
        passes = 1
        if route is None or route.models:
            passes = max(2, options.get("nbest", 1)) if route is not None and len(route.models) > 1 else 1
            check_queue(settings, libre, model_lines, passes)
        start = time.monotonic()
        left = lambda: disconnected(request)  # noqa: E731
        client = request.client.host if request.client else "-"
        try:
            # a client's share counts every line the request sends a model: through a pivot, the second model's
            # (the first's candidates, nbest a line), as the queue bound does
            with shares.hold(client, model_lines * passes, service.metrics.client_shed.inc):
                if route is None:
                    done = await service.parse(flat, options, left, deadline)
                else:
                    decode = partial(service.decode, route, left=left, deadline=deadline)
                    done = (joined(await decode(flatten(pieces), options), pieces) if pieces is not None
                            else await decode(flat, options))  # fmt: skip
        except ModelLoading as err:
            raise ApiError(503, str(err), "loading", {"Retry-After": str(err.retry_after)}) from None
        except ModelFailed as err:
            raise ApiError(503, str(err), "model_failed", {"Retry-After": str(err.retry_after)}) from None
        except Overloaded as err:
            headers = {"Retry-After": str(err.retry_after)}
            raise (ApiError(429, f"Slowdown: {err}", "overloaded", headers) if libre
                   else ApiError(503, str(err), "overloaded", headers)) from None  # fmt: skip
        except LineTooLong as err:
            raise ApiError(400, f"Invalid request: {err}", "too_long") from None
        except TimeoutError:
            raise too_slow(settings.request_timeout, noun) from None
        except ConnectionAbortedError:
            raise ApiError(499, "the client left", "disconnected") from None
        except TranslationError as err:
            raise ApiError(500, f"{doing} this request failed: {err}", "model") from None
        service.metrics.latency.labels(api=api).observe(time.monotonic() - start)
        service.metrics.requests.labels(api=api, status="200").inc()
        out, at = [], 0
        for text in lines_per_text:
            out.append(done[at : at + len(text)])
            at += len(text)
        return out

    made = (routers or translation_routers)(service, run, check_key)
    for router in made:
        app.include_router(router, responses=REFUSALS)
    generate = app.openapi

    def openapi() -> dict:
        """FastAPI's schema, with what a router declares of this server (`declare`: its languages, its bounds)."""
        if app.openapi_schema is None:
            schema = generate()
            for router in made:
                getattr(router, "declare", lambda _schema: None)(schema)
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/health", summary="ready or not, and what is served", responses={503: REFUSALS[503]})
    async def health() -> JSONResponse:
        failed = [m.name for m in service.models if m in service.failed]
        # failed: no model can serve (503, so that a load balancer sends the traffic elsewhere); degraded: some
        state = ("stopping" if service.draining else "loading" if not service.ready else "failed"
                 if len(failed) == len(service.models) else "degraded" if failed else "ready")  # fmt: skip
        first = service.models[0]
        body = {
            "status": state,
            "model": first.model_dir,
            "languages": list(service.default_pair()),
            "models": service.describe(),
            "device": service.device,
            "precision": service.precision,
            "queue": service.depth,
        }
        if state == "loading":
            body["progress"] = service.progress  # the preload's: models loaded of those to load, the one loading
        if failed:
            body["failed"] = failed
        # degraded: some model failed to load (tried again with backoff; /v1/models says why) and the others serve
        return JSONResponse(body, status_code=200 if state in ("ready", "degraded") else 503)

    @app.get(
        "/metrics",
        summary="Prometheus metrics (with --api_keys, a key is needed unless --open_metrics)",
        response_class=PlainTextResponse,
        responses={code: REFUSALS[code] for code in (400, 403, 503)},
    )
    async def metrics(request: Request) -> PlainTextResponse:
        if not settings.open_metrics:
            check_key(None, request.headers.get("authorization"))  # a key in the query string: 400 (guard.py)
        service.metrics.queue.set(service.depth)
        return PlainTextResponse(generate_latest(service.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4")  # fmt: skip

    return app


# the refusals every route may answer (docs/serving.md, "Errors"), in the schema as they are sent: JSON whose
# `error` names the field or the bound
REFUSALS: dict[int | str, dict] = {
    status: {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}
    for status, description in {
        400: "a field missing or invalid, or a bound passed (LibreTranslate's API)",
        403: "no key, or a key not given (--api_keys)",
        404: "nothing here, or no such translated file",
        413: "a bound passed (the native API)",
        429: "the queue, a client's share or a key's rate is full: retry after Retry-After",
        503: "loading, stopping, overloaded (the native API) or the model failed: retry after Retry-After",
        504: "no answer within --request_timeout",
    }.items()
}  # fmt: skip


def _validation_message(errors: list[dict]) -> str:
    """Pydantic's errors as one sentence naming each field."""
    parts = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "the request"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "Invalid request: " + "; ".join(parts)
