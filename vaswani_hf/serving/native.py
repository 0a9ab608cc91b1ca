"""Our own API beside LibreTranslate's: `POST /v1/translate` (n-best with scores, per-request decoding within the
server's bounds, the cross-attention of the best translation, the route taken: direct or composed through a pivot),
`GET /v1/models` and `GET /v1/model?source=&target=` (what is served) and `GET /`, the page to try the models in a
browser (page.html, shipped with the package: no build step, nothing from a CDN).

Its statuses are its own (docs/serving.md): 422 for a missing or invalid field, 413 for too much text, 403 without a
valid key, 503 with Retry-After when the queue is full or the server is stopping, 504 past --request_timeout."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, field_validator

from .catalog import Catalog, NoRoute, Route, ServedModel
from .guard import ApiError, not_text
from .service import LANGUAGE_NAMES, saved_facts


class NativeRequest(BaseModel):
    """`POST /v1/translate`: texts (each may hold several lines) and the decoding options of this request."""

    texts: list[str] = Field(description="the texts to translate; a text with several lines is translated line by "
                             "line, and its lines come back in order, empty lines kept")  # fmt: skip
    source: str | None = Field(default=None, description="the source language (default: the first model's)")
    target: str | None = Field(default=None, description="the target language (default: the first model's)")
    beam_size: int | None = Field(default=None, ge=1, description="beam width (default: the server's; at most "
                                  "--max_beam)")  # fmt: skip
    length_penalty: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False, strict=True,
                                         description="GNMT alpha, 0 to 2 (paper: 0.6)")  # fmt: skip
    nbest: int = Field(default=1, ge=1, description="translations per text, best first (at most --max_nbest)")
    scores: bool = Field(
        default=True, strict=True, description="give each translation's length-penalised log-probability"
    )
    attention: bool = Field(default=False, strict=True, description="give the cross-attention of each line's best "
                            "translation (the last decoder layer, averaged over its heads)")  # fmt: skip

    @field_validator("texts", "source", "target")
    @classmethod
    def _text(cls, value):
        return text_only(value)


class NativeTranslation(BaseModel):
    text: str
    score: float | None = None
    nbest: list[dict] | None = None
    attention: list[dict] | None = None


class NativeResponse(BaseModel):
    translations: list[NativeTranslation]
    model: str
    route: dict = Field(description="source, target, pivot (None: direct), the models in order, composed or not")


def text_only(value):
    """A field's strings must be text UTF-8 can write: JSON's "\\ud800" (a lone surrogate) is refused (422)."""
    if not_text(value):
        raise ValueError("holds a lone surrogate (such as \\ud800), which is not text")
    return value


def check_search_bounds(settings, beam_size: int | None, nbest: int | None) -> None:
    """A request's beam and n-best within the server's bounds (--max_beam, --max_nbest), else 422 naming them."""
    for name, value, most, option in (("beam_size", beam_size, settings.max_beam, "--max_beam"),
                                      ("nbest", nbest, settings.max_nbest, "--max_nbest")):  # fmt: skip
        if value is not None and value > most:
            raise ApiError(422, f"invalid request: {name} {value} is over this server's limit of {most} "
                           f"({option})", "invalid")  # fmt: skip


def native_router(catalog: Catalog, run, check_key) -> APIRouter:
    """The routes; `run` translates a request's texts along a route within the bounds, `check_key` checks its key."""
    settings, router = catalog.settings, APIRouter()

    def route_of(source: str | None, target: str | None, status: int = 422) -> Route:
        """The pair's route (a field left out: the first model's); a pair not served is a 422, or `status`."""
        default = catalog.default_pair()
        try:
            source, target = (source or "").strip() or default[0], (target or "").strip() or default[1]
            return catalog.route(source.lower(), target.lower())
        except NoRoute as err:
            raise ApiError(status, f"invalid request: {err}", "language") from None

    router.declare = lambda schema: declare_bounds(schema, catalog)  # create_app applies it to the schema

    @router.post("/v1/translate", response_model=NativeResponse, summary="Translate texts, with n-best and scores")
    async def native_translate(asked: NativeRequest, request: Request,
                               authorization: Annotated[str | None, Header()] = None) -> NativeResponse:  # fmt: skip
        char_limit = check_key(None, authorization)
        check_search_bounds(settings, asked.beam_size, asked.nbest)
        route = route_of(asked.source, asked.target)
        options = {k: v for k, v in (("beam_size", asked.beam_size), ("length_penalty", asked.length_penalty))
                   if v is not None}  # fmt: skip
        if asked.nbest > 1:
            options["nbest"] = asked.nbest
        if asked.attention:
            if len(route.models) != 1:
                raise ApiError(422, f"invalid request: attention is one model's, and {route.source}->{route.target} "
                               f"is {'composed' if route.models else 'the identity'}", "invalid")  # fmt: skip
            options["attention"] = True
        results = await run([lines_of(text) for text in asked.texts], options, request, "native", route=route,
                            char_limit=char_limit)  # fmt: skip
        translations = []
        for lines in results:
            best = "\n".join(t.nbest[0][0] for t in lines)
            score = sum(t.nbest[0][1] for t in lines) if asked.scores and _scored(lines) else None
            nbest = None
            if asked.nbest > 1:
                nbest = [{"text": alternative(lines, k), "score": _score_at(lines, k) if asked.scores else None}
                         for k in range(min(len(t.nbest) for t in lines) if lines else 0)]  # fmt: skip
            attention = [t.attention for t in lines] if asked.attention else None
            translations.append(NativeTranslation(text=best, score=score, nbest=nbest, attention=attention))
        names = " + ".join(model.model_dir for model in route.models) or "identity"
        return NativeResponse(translations=translations, model=names, route=route.describe())

    @router.get("/v1/model", summary="What is served for a pair (default: the first model's): the model's size, "
                "its scores, the server's limits")  # fmt: skip
    async def model_facts(request: Request, source: str | None = None, target: str | None = None) -> dict:
        for name in ("source", "target"):
            if request.query_params.getlist(name)[1:]:
                raise ApiError(422, f"invalid request: {name} is given more than once: give one language", "invalid")
        route = route_of(source, target, 404)  # what is served for a pair: nothing here
        facts = describe(catalog, route.models[0] if route.models else catalog.models[0])
        names = {"source_name": LANGUAGE_NAMES.get(route.source, route.source),
                 "target_name": LANGUAGE_NAMES.get(route.target, route.target)}  # fmt: skip
        if len(route.models) != 1:  # composed (or the identity): the route's models, not the first one's
            facts.pop("failure", None)
            facts |= route_facts(catalog, route)
        return {**facts, **route.describe(), **names}

    @router.get("/v1/models", summary="Every model served and every pair the server answers")
    async def models_facts() -> dict:
        def named(route: Route) -> dict:
            codes = {"source": route.source, "target": route.target, "pivot": route.pivot}
            return {**route.describe(), **{f"{k}_name": LANGUAGE_NAMES.get(c, c) for k, c in codes.items() if c}}

        return {"models": [describe(catalog, model) for model in catalog.models],
                "pairs": [named(route) for route in catalog.routes.values()]}  # fmt: skip

    @router.get("/", response_class=HTMLResponse, summary="A page to try the models in a browser")
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE)

    return router


def declare_bounds(schema: dict, catalog: Catalog) -> None:
    """The served languages and the server's --max_nbest and --max_beam in its OpenAPI schema (pydantic's is the
    same for every server): a request the schema allows is one the server takes."""
    settings, languages = catalog.settings, {"source": catalog.sources(), "target": catalog.targets()}
    asking = schema["components"]["schemas"]["NativeRequest"]
    asking["anyOf"], fields = pairs_schema(catalog, native=True), asking["properties"]
    fields["nbest"]["maximum"] = settings.max_nbest
    fields["beam_size"]["anyOf"][0]["maximum"] = settings.max_beam
    asked = [p for p in schema["paths"]["/v1/model"]["get"]["parameters"] if p["name"] in languages]
    for name, codes in languages.items():
        for field in [fields[name], *(p["schema"] for p in asked if p["name"] == name)]:
            field["anyOf"][0]["enum"] = [*codes, ""]  # empty: the first model's


def pairs_schema(catalog: Catalog, auto: bool = False, native: bool = False) -> list[dict]:
    """The pairs a request may name, as JSON Schema's `anyOf` over its source and target: each pair served; `auto`:
    the source auto with any target; `native`: the native API's, whose field left out, null or empty is the first
    model's language, and whose `attention` is one model's (not a composed pair's, nor the identity's)."""
    first, pairs = catalog.default_pair(), []
    for (source, target), route in catalog.routes.items():
        codes = {name: [code, None, ""] if native and code == default else [code]
                 for name, code, default in (("source", source, first[0]), ("target", target, first[1]))}  # fmt: skip
        fields = {name: {"enum": values} for name, values in codes.items()}
        if native and len(route.models) != 1:
            fields["attention"] = {"enum": [False]}
        pairs.append({"properties": fields})
    return pairs + [{"properties": {"source": {"enum": ["auto"]}}}] * auto


PAGE = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")


def describe(catalog: Catalog, model: ServedModel) -> dict:
    """A model's pair, size and scores (its config and training facts, read without loading it), and the limits a
    client must keep to."""
    settings = catalog.settings
    facts = saved_facts(model.model_dir)
    evaluation = facts.get("evaluation") or {}
    try:
        config = json.loads((Path(model.model_dir) / "config.json").read_text())
    except (OSError, ValueError):  # an ONNX folder holds its config elsewhere
        config = {}
    service = catalog.loaded.get(model)
    parameters = getattr(getattr(service, "model", None), "parameters", None)
    return {
        "model": model.name,
        "source": model.source,
        "target": model.target,
        "source_name": LANGUAGE_NAMES.get(model.source, model.source),
        "target_name": LANGUAGE_NAMES.get(model.target, model.target),
        "parameters": sum(p.numel() for p in parameters())
        if parameters
        else (facts.get("model") or {}).get("parameters"),  # fmt: skip
        "size": {name: config.get(name) for name in ("d_model", "encoder_layers", "decoder_layers")}
        | {"heads": config.get("encoder_attention_heads")},
        "scores": {k: v for k, v in evaluation.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        "loaded": service is not None,
        **catalog.state_facts(model),  # loaded, loading, unloading, failed (see "failure") or unloaded
        "char_limit": settings.max_chars,
        "key_required": bool(settings.api_keys),
        "max_nbest": settings.max_nbest,
        "max_beam": settings.max_beam,
        "device": catalog.device,
        "precision": catalog.precision,
        "endpoint": "v1/translate",  # where the page sends what is typed (a parser's routes say /parse)
    }


def route_facts(catalog: Catalog, route: Route) -> dict:
    """What a composed pair or the identity is, where `describe` tells one model: its models' names, parameters
    summed (None where one is unknown; 0 for the identity, which computes nothing), no one size or score (each model
    has its own: `each_model`), loaded only when every model is; its state "failed" where a model failed (with that
    model's failure), else the state of the first model not loaded."""
    each = [describe(catalog, model) for model in route.models]
    parameters = [one["parameters"] for one in each]
    waiting = [one for one in each if one["state"] != "loaded"]
    failed = [one for one in waiting if one["state"] == "failed"]
    facts = {
        "model": " + ".join(m.name for m in route.models) or "identity",
        "parameters": None if None in parameters else sum(parameters),
        "size": {},
        "scores": {},
        "loaded": not waiting,
        "state": (failed or waiting)[0]["state"] if waiting else "loaded",
        "each_model": [
            {key: one[key] for key in ("model", "source", "target", "parameters", "size", "scores", "state")}
            for one in each
        ],  # fmt: skip
    }
    if failed and "failure" in failed[0]:
        facts["failure"] = failed[0]["failure"]
    return facts


def lines_of(text: str) -> list[str]:
    """A text's lines as `vaswani translate` reads a file's: split at line ends, a carriage return dropped."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def _scored(lines: list) -> bool:
    return all(t.nbest[0][1] is not None for t in lines)


def alternative(lines: list, k: int) -> str:
    """The text's k-th candidate, line by line (a line with fewer candidates gives its best)."""
    return "\n".join(t.nbest[min(k, len(t.nbest) - 1)][0] for t in lines)


def _score_at(lines: list, k: int) -> float | None:
    scores = [t.nbest[min(k, len(t.nbest) - 1)][1] for t in lines]
    return sum(scores) if lines and all(s is not None for s in scores) else None
