"""LibreTranslate's API, as its own server (1.9.6) answers it and its clients call it: `POST /translate`, `/detect`,
`/translate_file` and `/suggest`, `GET /languages`, `/frontend/settings`, `/spec` and `/download_file/...`.

Fields come as LibreTranslate reads them: a JSON body alone, or else the query string and the form (urlencoded or
multipart), the query string first; `q` may also repeat in a form. Refusals are LibreTranslate's: 400 for a missing,
empty or invalid field and for too much text, 400 for a missing key and 403 for a wrong one, 429 ("Slowdown: ...")
when the queue is full, 500 when the model failed, each as `{"error": message}` with LibreTranslate's wording where
it has one. Two choices differ from it, on purpose (docs/serving.md): --max_chars counts a request's characters
together, not each text's, and 404 and 405 are JSON too.

Hostile input gets a 400 naming the field, never a 500: a field of the wrong type (a number, a list of numbers,
null, Infinity), a lone surrogate (JSON's "\\ud800": not text UTF-8 can write), JSON nested past Python's recursion
limit, a bad multipart body, a key that is not a string. The characters are counted as the client sent them
(LibreTranslate counts len(q)) before anything reads the text: language detection, the HTML parsing (markup.py:
linear, and off the event loop with the detection, so /health answers meanwhile), the sentence splitting.

`source: auto` translates from the likeliest served language that reaches the target. Where the identifier is sure
of a language no model reads to the target, the refusal names that language and the target; where that language is
the target itself, or where no other language reaches the target and the identifier is guessing, the text comes
back unchanged (the identity route, as LibreTranslate answers source == target) rather than refusing with a
language the client never named."""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from pathlib import PurePath
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from .catalog import Catalog, NoRoute, Route
from .guard import ApiError, check_chars, deadline_of, each, not_text, shown, too_long, too_slow, within
from .language_id import detect
from .markup import BadMarkup, Document, TooManyTexts
from .native import alternative, lines_of, pairs_schema
from .service import LANGUAGE_NAMES

FILE_FORMATS = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8",
                ".htm": "text/html; charset=utf-8"}  # fmt: skip
KEPT_FILES, KEPT_SECONDS = 64, 3600  # translated files waiting for their download: the newest, for an hour


def missing(name: str) -> ApiError:
    return ApiError(400, f"Invalid request: missing {name} parameter", "invalid")


def invalid(message: str) -> ApiError:
    return ApiError(400, f"Invalid request: {message}", "invalid")


def languages_of(fields: dict) -> tuple[str, str]:
    """The request's source and target, lower-cased (codes are case-insensitive); each must be given, as a code."""
    for name in ("source", "target"):
        value = fields.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise missing(name)
        if not isinstance(value, str) or len(value) > 32 or not value.strip().isprintable():
            raise invalid(f"{name} must be a language code such as en, not {shown(value)}")
    return fields["source"].strip().lower(), fields["target"].strip().lower()


def texts_of(fields: dict) -> list[str]:
    """`q`: a text or a list of texts, else 400 naming it."""
    q = fields.get("q")
    if q is None or q == "" or q == []:
        raise missing("q")
    if isinstance(q, str):
        return [q]
    if isinstance(q, list) and all(isinstance(text, str) for text in q):
        return q
    raise invalid(f"q must be a text or a list of texts, not {type(q).__name__}")


def key_of(fields: dict) -> str | None:
    """The key from the body (JSON or form): a string, or none; the query string's is refused (guard.py)."""
    key = fields.get("api_key")
    if key is not None and not isinstance(key, str):
        raise invalid(f"api_key must be a string, not {type(key).__name__}")
    return key or None


def content_disposition(name: str) -> str:
    """An attachment's header for any file name (RFC 6266): an ASCII fallback, and the name itself in UTF-8
    (RFC 5987's filename*), which a header's latin-1 cannot carry."""
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\%' else "_" for c in name)
    if fallback == name:
        return f'attachment; filename="{name}"'
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


# the fields LibreTranslate's routes read (from JSON, a form or the query string), as its own spec declares them,
# with what this server refuses of them (fields_of): an empty text, the languages it does not serve, its bounds
TEXT = {"type": "string"}
FORMS = ["application/json", "application/x-www-form-urlencoded", "multipart/form-data"]


def fields_of(catalog: Catalog, form: bool = False) -> dict[str, dict]:
    """Every field of LibreTranslate's routes as this server takes it (a route's schema takes those it reads). In a
    form, a list of one text is that text: `[""]` is an empty q."""
    settings, most = catalog.settings, catalog.settings.batch_limit
    texts = [{"type": "array", "items": TEXT, "minItems": 1, "maxItems": most}]
    if form:
        texts = [
            {"type": "array", "items": TEXT, "minItems": 2, "maxItems": most},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
        ]
    return {
        "q": {"anyOf": [{"type": "string", "minLength": 1}, *texts]},
        "source": {"type": "string", "enum": ["auto", *catalog.sources()]},
        "target": {"type": "string", "enum": catalog.targets()},
        "format": {"anyOf": [{"type": "string", "enum": ["text", "html", ""]}, {"type": "null"}]},  # "", null: text
        # as LibreTranslate reads it, int() of the value: below 0, null, false, "" or left out is none
        "alternatives": {"anyOf": [{"type": "integer", "maximum": settings.max_nbest - 1},
                                   {"type": "number", "exclusiveMaximum": settings.max_nbest},
                                   {"type": "boolean"}, {"type": "null"},
                                   {"type": "string", "pattern": r"^\s*([+-]?[0-9]+)?\s*$"}]},  # fmt: skip
        "api_key": {"anyOf": [TEXT, {"type": "null"}]},  # null: none
        "file": {"type": "string", "format": "binary"},  # UTF-8 text, named with a suffix of FILE_FORMATS
    }  # fmt: skip


def request_body(catalog: Catalog, names: list[str], required: list[str], types: list[str] = FORMS) -> dict:
    """The OpenAPI request body of a route that reads its fields by hand: these fields in each content type, and
    the pairs served (a route with a source and a target)."""
    content = {}
    for kind in types:
        fields = fields_of(catalog, form=kind != "application/json")
        schema = {"type": "object", "properties": {name: fields[name] for name in names}, "required": required}
        if "source" in names:
            schema["anyOf"] = pairs_schema(catalog, auto=True)
        content[kind] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}


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

    async def in_time(request: Request, work, *args):
        """`work(*args)` off the event loop, within the request's time (504 past it): parsing, detection."""
        try:
            return await within(deadline_of(request, settings.request_timeout), work, *args)
        except TimeoutError:
            raise too_slow(settings.request_timeout, "translation") from None

    def documents_of(texts: list[str]) -> list[Document]:
        """The HTML texts parsed; refused (400) past --max_lines text nodes or where the parser cannot read one."""
        try:
            return each(lambda text: Document(text, settings.max_lines), texts)  # none started past the deadline
        except TooManyTexts as err:
            raise too_long(True, f"the document has more than {err.most} text nodes to translate, each a line for "
                           f"the model; this server takes at most {settings.max_lines} a request (--max_lines): "
                           "send it in parts") from None  # fmt: skip
        except BadMarkup as err:
            raise ApiError(400, f"Invalid request: {err}", "invalid") from None

    def detected(texts: list[str], target: str, html: bool = False) -> tuple[dict, str]:
        """`source: auto`: the language of the texts (one detection for all, as LibreTranslate makes), as reported,
        and the source to translate from: the likeliest served source that reaches `target` (where the identifier
        is guessing, the first model's, or the first that reaches it). Refused when the identifier is sure, on
        enough text, that it is a language no model reads to `target`. For `html`, the text nodes that would be
        translated, not the markup (attributes, scripts and class names would be read as a language)."""
        if html:
            texts = [" ".join(document.texts()) for document in documents_of(texts)]
        text = "\n".join(texts)
        reaching = [code for code in catalog.sources() if (code, target) in catalog.routes and code != target]
        itself = (target, target) in catalog.routes  # the target is served: text in it comes back unchanged
        if not reaching and not itself:
            route_of(target, target)  # the target is no served language: LibreTranslate's "xx is not supported"
        default = catalog.default_pair()[0]
        ranked = detect(text, default if default in reaching else (reaching or [target])[0])
        best = ranked[0]
        served = next((r for r in ranked if r["language"] in reaching), None)
        sure = best["confidence"] >= settings.detect_threshold * 100 and len(text.strip()) >= settings.detect_min_chars
        if sure and best["language"] == target and itself:
            return best, target  # already in the target language: as it is
        if sure and best["language"] not in reaching:
            code = best["language"]
            sources = " or ".join(f"{name_of(c)} ({c})" for c in reaching) or "no other language"
            raise ApiError(400, f"Invalid request: the text is {name_of(code)} ({code}, confidence "
                           f"{best['confidence']:g}), but this server translates {sources} to {name_of(target)} "
                           f"({target})", "language")  # fmt: skip
        if served is not None:
            return served, served["language"]
        # the identifier is guessing: from the first model's source where it reaches the target, else the first
        # language that does, else (none does) the target itself
        return best, default if default in reaching else reaching[0] if reaching else target

    async def translated(texts: list[str], html: bool, options: dict, request: Request, route: Route,
                         char_limit: int | None) -> tuple[list[str], list]:  # fmt: skip
        """Each text's translation, line by line, or for html its text nodes' with the markup kept; and the lines'
        results (their n-best)."""
        chars = sum(map(len, texts))  # as the client sent them (LibreTranslate's len(q)), markup included
        if html:  # parsed off the event loop (linear, but a megabyte of tags is a few tenths of a second)
            documents = await in_time(request, documents_of, texts)
            lines = [document.texts() for document in documents]
        else:
            lines = [lines_of(text) for text in texts]
        results = await run(lines, options, request, "libretranslate", chars=chars, route=route,
                            char_limit=char_limit)  # fmt: skip
        best = [[t.nbest[0][0] for t in text] for text in results]
        if html:
            rendered = await in_time(
                request, each, lambda pair: pair[0].render(pair[1]), list(zip(documents, best, strict=True))
            )
            return rendered, results
        return ["\n".join(b) for b in best], results

    @router.post(
        "/translate",
        summary="LibreTranslate's translate: JSON, a form or the query string",
        openapi_extra=request_body(
            catalog, ["q", "source", "target", "format", "alternatives", "api_key"], ["q", "source", "target"]
        ),
    )
    async def translate(request: Request) -> JSONResponse:
        fields = await read_fields(request)
        char_limit = check_key(key_of(fields), request.headers.get("authorization"))
        texts = texts_of(fields)
        q = fields["q"]
        source, target = languages_of(fields)
        form = fields.get("format")
        form = "text" if form is None or form == "" else form  # an object or a list is no format: refused
        if not isinstance(form, str) or form not in ("text", "html"):
            raise ApiError(400, f"{shown(form)} format is not supported", "invalid")
        asked = fields.get("alternatives", 0)
        try:
            count = max(0, int(asked if asked not in (None, "") else 0))
        except (TypeError, ValueError, OverflowError):  # a list, "x", NaN, Infinity
            raise ApiError(400, "Invalid request: alternatives parameter is not a number", "invalid") from None
        if count > settings.max_nbest - 1:
            raise ApiError(400, f"Invalid request: alternatives parameter must be <= {settings.max_nbest - 1}",
                           "invalid")  # fmt: skip
        if len(texts) > settings.batch_limit:
            raise ApiError(400, f"Invalid request: request ({len(texts)}) exceeds text limit ({settings.batch_limit})"
                           " (--batch_limit texts a request)", "too_long")  # fmt: skip
        check_chars(settings, True, sum(map(len, texts)), char_limit)  # before the detection and the parsing
        found, source = (await in_time(request, detected, texts, target, form == "html") if source == "auto"
                         else (None, source))  # fmt: skip
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

    @router.post(
        "/detect",
        openapi_extra=request_body(catalog, ["q", "api_key"], ["q"]),
        summary="LibreTranslate's detect: the text's likeliest languages, best first",
    )
    async def detect_language(request: Request) -> list[dict]:
        fields = await read_fields(request)
        char_limit = check_key(key_of(fields), request.headers.get("authorization"))
        text = "\n".join(texts_of(fields))
        check_chars(settings, True, len(text), char_limit)
        return await in_time(request, detect, text, catalog.default_pair()[0])

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

    @router.post("/translate_file", summary="LibreTranslate's file translation: .txt and .html",
                 openapi_extra=request_body(catalog, ["file", "source", "target", "api_key"],
                                            ["file", "source", "target"], ["multipart/form-data"]))  # fmt: skip
    async def translate_file(request: Request) -> dict:
        fields = await read_fields(request)
        char_limit = check_key(key_of(fields), request.headers.get("authorization"))
        upload = (await form_of(request)).get("file")  # the form read once: Starlette keeps it
        if not isinstance(upload, UploadFile) or not upload.filename:
            raise missing("file")
        if not_text(upload.filename):
            raise invalid("the file's name is not text: it holds a lone surrogate, which UTF-8 cannot write")
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
        check_chars(settings, True, len(text), char_limit)  # before the detection and the parsing
        route = route_of((await in_time(request, detected, [text], target, suffix != ".txt"))[1] if source == "auto"
                         else source,
                         target)  # fmt: skip
        (out,), _ = await translated([text], suffix != ".txt", {}, request, route, char_limit)
        stored = f"{uuid.uuid4().hex}.{PurePath(name).stem}_{target}{suffix}"
        now = time.time()
        for old in [k for k, (when, _) in files.items() if now - when > KEPT_SECONDS]:
            del files[old]
        files[stored] = (now, out.encode("utf-8"))
        while len(files) > KEPT_FILES:
            files.popitem(last=False)
        # the stored name quoted: '#', '?', '%' or '/' in a file's name would otherwise cut or change the URL
        return {"translatedFileUrl": str(request.url_for("download_file", filename=quote(stored, safe="")))}

    @router.get("/download_file/{filename}", name="download_file", summary="A translated file, once translated")
    async def download_file(filename: str) -> Response:
        if filename not in files:
            raise ApiError(404, f"no translated file {filename!r}: files are kept for {KEPT_SECONDS // 60} minutes "
                           f"(the newest {KEPT_FILES})", "not_found")  # fmt: skip
        download = filename.split(".", 1)[1]
        return Response(files[filename][1], media_type=FILE_FORMATS[PurePath(filename).suffix.lower()],
                        headers={"Content-Disposition": content_disposition(download)})  # fmt: skip

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
        except (ValueError, UnicodeDecodeError) as err:  # an int of over 4,300 digits is a ValueError too
            raise ApiError(400, f"Invalid JSON format: {shown(str(err), 120)}", "invalid") from None
        except RecursionError:
            raise ApiError(400, "Invalid JSON format: nested too deep", "invalid") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid JSON format: the body must be an object with q, source and target",
                           "invalid")  # fmt: skip
        for name, value in body.items():
            if not_text(value) or not_text(name):
                raise invalid(f"{shown(name)} is not text: it holds a lone surrogate, which UTF-8 cannot write")
        return body
    fields: dict[str, Any] = {}
    if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await form_of(request)
        fields.update({key: value for key, value in form.items() if isinstance(value, str)})
        if form.getlist("q")[1:]:
            fields["q"] = form.getlist("q")
    # the query string's fields, but never a key (guard.py refuses a key there where keys are asked for)
    fields.update((name, value) for name, value in request.query_params.items() if name != "api_key")
    if request.query_params.getlist("q")[1:]:
        fields["q"] = request.query_params.getlist("q")
    for name, value in fields.items():  # a form's charset (utf-7, unicode_escape) can make a lone surrogate too
        if not_text(value) or not_text(name):
            raise invalid(f"{shown(name)} is not text: it holds a lone surrogate, which UTF-8 cannot write")
    if isinstance(fields.get("q"), str):
        # as LibreTranslate: a form's CRLF (or CR) is one line end; every other character is kept, so HTML comes
        # back byte for byte (str.splitlines would also split at form feeds, U+2028 and the like)
        fields["q"] = fields["q"].replace("\r\n", "\n").replace("\r", "\n")
    return fields


async def form_of(request: Request):
    """The request's form (Starlette keeps it once read); a body that is not one it names is a 400."""
    try:
        return await request.form()
    except Exception as err:  # python-multipart's errors, a multipart type without a boundary, Starlette's 400
        detail = getattr(err, "detail", None) or str(err) or type(err).__name__
        raise invalid(f"the form cannot be read: {shown(detail, 120)}") from None


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
