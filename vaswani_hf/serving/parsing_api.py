"""A parse model over HTTP: `POST /parse` (trees in Penn Treebank brackets, n-best with scores, whether each was
repaired), `GET /v1/model` and the page at `/`, which draws the tree of what is typed; and, on the routes of a
translator (LibreTranslate's and `POST /v1/translate`), a 400 naming `POST /parse`.

The parse itself is `vaswani parse`'s, from parsing/parser.py: the tree constraint, the escaping of brackets, the
repair and the scores; the batch function (`parse_batch`) runs it on the dynamic batcher's batches, and `run`
(app.py) gives /parse the bounds, statuses, keys, metrics and draining of /v1/translate (docs/serving.md,
"Parsing")."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field, WithJsonSchema, field_validator

from ..parsing.linearization import linearize
from ..parsing.parser import INSTALL, TREE_SEARCHES, ParseResult, bracketed, parse_lines, require_parser, words_of
from .catalog import Catalog, ServedModel
from .guard import ApiError, check_chars, check_lines, shown
from .native import PAGE, check_search_bounds, describe, text_only
from .service import DECODING_OPTIONS, Service

# the routes a translator answers and a parser does not (LibreTranslate's, and the native one)
TRANSLATION_PATHS = ("/translate", "/translate_file", "/detect", "/suggest", "/languages", "/frontend/settings",
                     "/spec", "/v1/translate")  # fmt: skip


@dataclass
class Parsed:
    """One sentence's n-best, best first, each tree on one line of brackets (None for a sentence without words);
    `tokens`, the symbols of the best one (for the metrics' output tokens)."""

    nbest: list[ParseResult]
    tokens: int = 0


def parse_batch(service: Service, lines: list[str], options: dict) -> list[Parsed]:
    """One batch of sentences (each its words joined by spaces), parsed as `vaswani parse` parses them."""
    options = dict(options)
    nbest, tree_search = options.pop("nbest", 1), options.pop("tree_search", "constrained")
    decoding = {**service.settings.decoding, **{DECODING_OPTIONS[k]: v for k, v in options.items()}}
    parsing = require_parser(service.model, service.model_dir)
    results = parse_lines(service.model, service.tokenizer, parsing, lines, nbest, tree_search == "constrained",
                          batch_size=len(lines), long_lines=service.settings.long_lines, **decoding)  # fmt: skip
    parsed = []
    for parses in results:
        best = parses[0].tree
        # the symbols the model wrote for the best tree (its linearisation less the TOP bracket), and the end
        tokens = len(linearize(best).split()) - 1 if best is not None else 0
        parsed.append(Parsed([ParseResult(bracketed(p.tree) or None, p.score, p.repaired) for p in parses], tokens))
    return parsed


# a word as the parser takes it: not empty, no white space (str.split's, which also splits at \x1c-\x1f). The
# schema declares the pattern; `sentences`' validator below refuses such a word naming it (pydantic's own pattern
# error would say only "String should match pattern")
Word = Annotated[str, WithJsonSchema({"type": "string", "pattern": r"^[^\s\x1c-\x1f]+$"})]


class ParseRequest(BaseModel):
    """`POST /parse`: sentences, and the search of this request."""

    sentences: list[str | list[Word]] = Field(description="the sentences: a string is one sentence, tokenised as the "
                                             "Penn Treebank is (NLTK's TreebankWordTokenizer); a list of strings is "
                                             "a sentence's words, taken as they are")  # fmt: skip
    nbest: int = Field(default=1, ge=1, description="trees per sentence, best first (at most --max_nbest)")
    tree_search: Literal[TREE_SEARCHES] = Field(default="constrained", description="constrained: the search keeps "
                                                "to trees of the sentence; plain: section 6.3's search, its outputs "
                                                "repaired into trees")  # fmt: skip
    beam_size: int | None = Field(default=None, ge=1, description="beam width (default: the server's, the model's "
                                  "21; at most --max_beam)")  # fmt: skip
    length_penalty: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False, strict=True,
                                         description="GNMT alpha, 0 to 2 (paper, parsing: 0.3)")  # fmt: skip

    @field_validator("sentences")
    @classmethod
    def _text(cls, value):
        for number, sentence in enumerate(text_only(value)):
            if isinstance(sentence, list):  # the words the schema's pattern allows, refused here by name
                try:
                    words_of(sentence)
                except ValueError as err:
                    raise ValueError(f"sentences.{number}: {err}") from None
        return value


class ParseCandidate(BaseModel):
    tree: str | None = Field(description="the tree in Penn Treebank brackets under TOP (null: no words)")
    score: float | None = Field(description="the length-penalised log-probability beam search ranked it by")
    repaired: bool = Field(description="whether the output was mended into a tree of the sentence")


class ParseAnswer(ParseCandidate):
    nbest: list[ParseCandidate] | None = None


class ParseResponse(BaseModel):
    parses: list[ParseAnswer]
    model: str


def parse_router(catalog: Catalog, run, check_key) -> APIRouter:
    """`POST /parse`, `GET /v1/model` and the page; `run` decodes a request's lines within the bounds, `check_key`
    checks its key."""
    settings, router = catalog.settings, APIRouter()
    parser = next(model for model in catalog.models if not model.routed)

    @router.post("/parse", response_model=ParseResponse, summary="Parse sentences into constituency trees")
    async def parse(asked: ParseRequest, request: Request,
                    authorization: Annotated[str | None, Header()] = None) -> ParseResponse:  # fmt: skip
        char_limit = check_key(None, authorization)
        check_search_bounds(settings, asked.beam_size, asked.nbest)
        # the bounds before the tokenizer reads a word (NLTK's takes a second a megabyte, on the event loop)
        chars = sum(len(s) if isinstance(s, str) else sum(map(len, s)) + len(s) - 1 for s in asked.sentences if s)
        check_lines(settings, False, len(asked.sentences))
        check_chars(settings, False, chars, char_limit)
        lines = []
        for number, sentence in enumerate(asked.sentences):
            try:  # what the tokenizer changed is logged at DEBUG only: it is the client's text
                words = words_of(sentence, logging.DEBUG)
            except ImportError:
                raise ApiError(501, f"sentences.{number} is a string, which this server tokenises with NLTK, and "
                               f"NLTK is not installed here ({INSTALL} on the server): send each sentence as a list "
                               "of words", "no_tokenizer") from None  # fmt: skip
            except ValueError as err:
                raise ApiError(422, f"invalid request: sentences.{number}: {shown(str(err), 200)}", "invalid") from None
            lines.append(" ".join(words))
        options = {k: v for k, v in (("beam_size", asked.beam_size), ("length_penalty", asked.length_penalty))
                   if v is not None}  # fmt: skip
        if asked.nbest > 1:
            options["nbest"] = asked.nbest
        if asked.tree_search != "constrained":
            options["tree_search"] = asked.tree_search
        results = await run([[line] for line in lines], options, request, "parse", chars=chars, noun="parse",
                            doing="parsing", char_limit=char_limit)  # fmt: skip
        answers = []
        for (parsed,) in results:
            candidates = [ParseCandidate(tree=tree, score=score, repaired=repaired)
                          for tree, score, repaired in parsed.nbest]  # fmt: skip
            nbest = candidates if asked.nbest > 1 else None
            answers.append(ParseAnswer(**candidates[0].model_dump(), nbest=nbest))
        return ParseResponse(parses=answers, model=parser.model_dir)

    @router.get("/v1/model", summary="What is served: the parser's size, its scores, the server's limits")
    async def model_facts() -> dict:
        return {**describe(catalog, parser), "endpoint": "parse"}  # the page parses and draws trees at this endpoint

    @router.get("/", response_class=HTMLResponse, summary="A page to try the parser in a browser: it draws the tree")
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE)

    return router


def refusing_translation_router(parser: ServedModel) -> APIRouter:
    """A translator's routes, each answering 400 with what to call instead: a LibreTranslate app pointed at a
    parser learns why nothing is translated, rather than meeting a 404."""
    router = APIRouter()
    message = (f"this server parses: {parser.model_dir} is a constituency parser, not a translation model. POST "
               '/parse with {"sentences": ["The dog barked ."]} for trees (docs/serving.md, "Parsing")')  # fmt: skip

    async def refuse() -> None:
        raise ApiError(400, message, "not_a_translator")

    for path in TRANSLATION_PATHS:
        router.add_api_route(path, refuse, methods=["GET", "POST"], include_in_schema=False)
    return router


def parsing_routers(catalog: Catalog, run, check_key) -> list[APIRouter]:
    """A parse model's routes (a task's `serving` names them): where no translator is served beside it, the
    translation routes answer what to call instead."""
    routers = [parse_router(catalog, run, check_key)]
    if not catalog.translators:
        routers.append(refusing_translation_router(next(m for m in catalog.models if not m.routed)))
    return routers
