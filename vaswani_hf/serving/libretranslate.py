"""LibreTranslate's API, as its own server (1.9.6) answers it and its clients call it: `POST /translate`, `/detect`,
`/translate_file` and `/suggest`, `GET /languages`, `/frontend/settings`, `/spec` and `/download_file/...`.

Fields come as LibreTranslate reads them: a JSON body alone, or else the query string and the form (urlencoded or
multipart), the query string first; `q` may also repeat in a form. Refusals are LibreTranslate's: 400 for a missing,
empty or invalid field and for too much text, 400 for a missing key and 403 for a wrong one, 429 ("Slowdown: ...")
when the queue is full, 500 when the model failed, each as `{"error": message}` with LibreTranslate's wording where
it has one. Two choices differ from it, on purpose (docs/serving.md): --max_chars counts a request's characters
together, not each text's, and 404 and 405 are JSON too."""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from pathlib import PurePath
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from .catalog import Catalog, NoRoute, Route
from .guard import ApiError
from .language_id import detect
from .markup import Document
from .native import alternative, lines_of
from .service import LANGUAGE_NAMES

FILE_FORMATS = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8",
                ".htm": "text/html; charset=utf-8"}  # fmt: skip
KEPT_FILES, KEPT_SECONDS = 64, 3600  # translated files waiting for their download: the newest, for an hour


def missing(name: str) -> ApiError:
    return ApiError(400, f"Invalid request: missing {name} parameter", "invalid")


def languages_of(fields: dict) -> tuple[str, str]:
    """The request's source and target, lower-cased (codes are case-insensitive); each must be given."""
    for name in ("source", "target"):
        if not fields.get(name) or not isinstance(fields[name], str):
            raise missing(name)
    return fields["source"].strip().lower(), fields["target"].strip().lower()


def libretranslate_router(catalog: Catalog, run, check_key) -> APIRouter:
    """The routes; `run` translates a request's texts along a route within the bounds, `check_key` checks its key.
    Every served pair answers, and pairs composed through a pivot, and each language to itself (catalog.py)."""
    settings, router = catalog.settings, APIRouter()
    files: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # download name -> (when, content)

    def name_of(code: str) -> str:
        return LANGUAGE_NAMES.get(code, code)

    def route_of(source: str, target: str) -> Route:
        """LibreTranslate's refusals of a language or a pair no model (nor two) translates."""
        try:
            return catalog.route(source, target)
        except NoRoute as err:
            raise ApiError(400, str(err), "language") from None

    def detected(texts: list[str], target: str) -> tuple[dict, str]:
        """`source: auto`: the language of the texts (one detection for all, as LibreTranslate makes), as reported,
        and the source to translate from: the likeliest served source that reaches `target` (where the identifier
        is guessing, the first model's, or the first that reaches it). Refused when the identifier is sure, on
        enough text, that it is a language no model reads to `target`."""
        text = "\n".join(texts)
        reaching = [code for code in catalog.sources() if (code, target) in catalog.routes and code != target]
        default = catalog.default_pair()[0]
        ranked = detect(text, default if default in reaching else (reaching or [default])[0])
        best = ranked[0]
        served = next((r for r in ranked if r["language"] in reaching), None)
        sure = best["confidence"] >= settings.detect_threshold * 100 and len(text.strip()) >= settings.detect_min_chars
        if sure and best["language"] not in reaching:
            code = best["language"]
            sources = " or ".join(f"{name_of(c)} ({c})" for c in reaching) or "no language"
            raise ApiError(400, f"Invalid request: the text is {name_of(code)} ({code}, confidence "
                           f"{best['confidence']:g}), but this server translates {sources} to {name_of(target)} "
                           f"({target})", "language")  # fmt: skip
        if served is not None:
            return served, served["language"]
        if not reaching:
            route_of(best["language"], target)  # LibreTranslate's refusal of the pair
        return best, default if default in reaching else reaching[0]

    async def translated(texts: list[str], html: bool, options: dict, request: Request, route: Route,
                         char_limit: int | None) -> tuple[list[str], list]:  # fmt: skip
        """Each text's translation, line by line, or for html its text nodes' with the markup kept; and the lines'
        results (their n-best)."""
        documents = [Document(text) for text in texts] if html else []
        lines = [document.texts() for document in documents] if html else [lines_of(text) for text in texts]
        results = await run(lines, options, request, "libretranslate", route=route, char_limit=char_limit)
        best = [[t.nbest[0][0] for t in text] for text in results]
        if html:
            return [document.render(b) for document, b in zip(documents, best, strict=True)], results
        return ["\n".join(b) for b in best], results

    @router.post("/translate", summary="LibreTranslate's translate: JSON, a form or the query string")
    async def translate(request: Request) -> JSONResponse:
        fields = await read_fields(request)
        char_limit = check_key(fields.get("api_key"), request.headers.get("authorization"))
        q = fields.get("q")
        if not q:
            raise missing("q")
        source, target = languages_of(fields)
        if not (isinstance(q, str) or (isinstance(q, list) and all(isinstance(t, str) for t in q))):
            raise ApiError(400, "Invalid request: q must be a text or a list of texts", "invalid")
        form = fields.get("format") or "text"
        if form not in ("text", "html"):
            raise ApiError(400, f"{form} format is not supported", "invalid")
        asked = fields.get("alternatives", 0)
        try:
            count = max(0, int(asked))
        except (TypeError, ValueError):
            raise ApiError(400, "Invalid request: alternatives parameter is not a number", "invalid") from None
        if count > settings.max_nbest - 1:
            raise ApiError(400, f"Invalid request: alternatives parameter must be <= {settings.max_nbest - 1}",
                           "invalid")  # fmt: skip
        texts = [q] if isinstance(q, str) else q
        if len(texts) > settings.batch_limit:
            raise ApiError(400, f"Invalid request: request ({len(texts)}) exceeds text limit ({settings.batch_limit})"
                           " (--batch_limit texts a request)", "too_long")  # fmt: skip
        found, source = detected(texts, target) if source == "auto" else (None, source)
        route = route_of(source, target)
        html = form == "html"  # as LibreTranslate: no alternatives for html
        texts_out, results = await translated(texts, html, {"nbest": count + 1} if count and not html else {},
                                              request, route, char_limit)  # fmt: skip
        alternatives = [[] if html else distinct([alternative(lines, k) for k in range(1, count + 1)], best)
                        for lines, best in zip(results, texts_out, strict=True)]  # fmt: skip
        single = isinstance(q, str)
        answer: dict[str, Any] = {"translatedText": texts_out[0] if single else texts_out}
        if count:
            answer["alternatives"] = alternatives[0] if single else alternatives
        if found:
            answer["detectedLanguage"] = found if single else [found] * len(texts)
        return JSONResponse(answer)

    @router.post("/detect", summary="LibreTranslate's detect: the text's likeliest languages, best first")
    async def detect_language(request: Request) -> list[dict]:
        fields = await read_fields(request)
        most = check_key(fields.get("api_key"), request.headers.get("authorization")) or settings.max_chars
        q = fields.get("q")
        if not q:
            raise missing("q")
        text = "\n".join(q) if isinstance(q, list) else str(q)
        if len(text) > most:
            raise ApiError(400, f"Invalid request: request ({len(text)}) exceeds text limit ({most})",
                           "too_long")  # fmt: skip
        return detect(text, catalog.default_pair()[0])

    @router.get("/languages", summary="LibreTranslate's languages: each source with every target it reaches")
    async def languages() -> list[dict]:
        # the targets: each model's, those composed through a pivot, and the language itself (LibreTranslate's)
        return [{"code": code, "name": name_of(code), "targets": catalog.targets_of(code)}
                for code in catalog.sources()]  # fmt: skip

    @router.get("/frontend/settings", summary="LibreTranslate's settings for its web page and apps")
    async def frontend_settings() -> dict:
        source, target = catalog.default_pair()
        return {
            "charLimit": settings.max_chars,
            "frontendTimeout": 500,
            "apiKeys": bool(settings.api_keys),
            "keyRequired": bool(settings.api_keys),
            "suggestions": False,
            "filesTranslation": True,
            "supportedFilesFormat": list(FILE_FORMATS),
            "language": {
                "source": {"code": source, "name": name_of(source)},
                "target": {"code": target, "name": name_of(target)},
            },  # fmt: skip
        }

    @router.get("/spec", summary="LibreTranslate's API as a Swagger 2.0 document")
    async def spec(request: Request) -> dict:
        return swagger(request.app.openapi())

    @router.post("/suggest", summary="LibreTranslate's suggestions: off on this server")
    async def suggest() -> JSONResponse:
        raise ApiError(403, "Suggestions are disabled on this server.", "suggestions_off")

    @router.post("/translate_file", summary="LibreTranslate's file translation: .txt and .html")
    async def translate_file(request: Request) -> dict:
        fields = await read_fields(request)
        char_limit = check_key(fields.get("api_key"), request.headers.get("authorization"))
        upload = (await request.form()).get("file")  # the form read once: Starlette keeps it
        if not isinstance(upload, UploadFile) or not upload.filename:
            raise missing("file")
        source, target = languages_of(fields)
        name = PurePath(upload.filename).name
        suffix = PurePath(name).suffix.lower()
        if suffix not in FILE_FORMATS:
            raise ApiError(400, f"Invalid request: file format not supported (this server translates "
                           f"{', '.join(FILE_FORMATS)} files)", "invalid")  # fmt: skip
        try:
            text = (await upload.read()).decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise ApiError(400, f"Invalid request: the file is not UTF-8 text ({err.reason} at byte {err.start})",
                           "invalid") from None  # fmt: skip
        route = route_of(detected([text], target)[1] if source == "auto" else source, target)
        (out,), _ = await translated([text], suffix != ".txt", {}, request, route, char_limit)
        stored = f"{uuid.uuid4().hex}.{PurePath(name).stem}_{target}{suffix}"
        now = time.time()
        for old in [k for k, (when, _) in files.items() if now - when > KEPT_SECONDS]:
            del files[old]
        files[stored] = (now, out.encode("utf-8"))
        while len(files) > KEPT_FILES:
            files.popitem(last=False)
        return {"translatedFileUrl": str(request.url_for("download_file", filename=stored))}

    @router.get("/download_file/{filename}", name="download_file", summary="A translated file, once translated")
    async def download_file(filename: str) -> Response:
        if filename not in files:
            raise ApiError(404, f"no translated file {filename!r}: files are kept for {KEPT_SECONDS // 60} minutes "
                           f"(the newest {KEPT_FILES})", "not_found")  # fmt: skip
        download = filename.split(".", 1)[1]
        return Response(files[filename][1], media_type=FILE_FORMATS[PurePath(filename).suffix.lower()],
                        headers={"Content-Disposition": f'attachment; filename="{download}"'})  # fmt: skip

    return router


def distinct(candidates: list[str], best: str) -> list[str]:
    """LibreTranslate's alternatives: in the search's order, each once, never the best one, never empty."""
    seen, kept = {best, ""}, []
    for candidate in candidates:
        if candidate not in seen:
            seen.add(candidate)
            kept.append(candidate)
    return kept


async def read_fields(request: Request) -> dict[str, Any]:
    """A request's fields as LibreTranslate reads them: from a JSON body alone (it must be an object), else from
    the query string and the form, the query string first; a repeated `q` in a form or query string is a list."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            body = json.loads(await request.body() or b"{}")
        except (ValueError, UnicodeDecodeError) as err:
            raise ApiError(400, f"Invalid JSON format: {err}", "invalid") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid JSON format: the body must be an object with q, source and target",
                           "invalid")  # fmt: skip
        return body
    fields: dict[str, Any] = {}
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.form()
        fields.update({key: value for key, value in form.items() if isinstance(value, str)})
        if form.getlist("q")[1:]:
            fields["q"] = form.getlist("q")
    fields.update(request.query_params)
    if request.query_params.getlist("q")[1:]:
        fields["q"] = request.query_params.getlist("q")
    if isinstance(fields.get("q"), str):
        fields["q"] = "\n".join(fields["q"].splitlines())  # as LibreTranslate: a form's CRLF is one line end
    return fields


def swagger(openapi: dict) -> dict:
    """LibreTranslate's /spec is a Swagger 2.0 document titled LibreTranslate (clients such as Dialect check both):
    ours lists the LibreTranslate routes this server answers, from its OpenAPI document."""
    paths = {path: {method: {"summary": op.get("summary", ""), "responses": {"200": {"description": "OK"}}}
                    for method, op in ops.items()}
             for path, ops in openapi.get("paths", {}).items()
             if path.startswith(("/translate", "/detect", "/languages", "/frontend", "/suggest"))}  # fmt: skip
    return {
        "swagger": "2.0",
        "info": {
            "title": "LibreTranslate",
            "version": "1.9.6",
            "description": "LibreTranslate's API, served by vaswani serve (a Transformer of 'Attention Is All You "
            "Need'); its own API is at /docs",
            "license": {"name": "Apache-2.0"},
        },  # fmt: skip
        "basePath": "/",
        "paths": paths,
    }
