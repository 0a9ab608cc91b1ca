"""`vaswani serve` against hostile clients: every malformed, oversized or pathological request gets a JSON 4xx
naming its field or the bound it passes, never a 5xx, and the server stays responsive meanwhile.

Through a real server process (sockets) where it is about the event loop: a megabyte of pathological HTML answered
within a second while /health stays fast, and a request of more sentences than --max_lines or the queue can ever
hold refused for good (not 429 with Retry-After). In process (create_app) otherwise: fields of every wrong type, lone
surrogates, JSON nested too deep, bad multipart bodies, file names outside latin-1, keys in the query string,
`source: auto` to a target nothing else reaches, /parse's bounds before its tokenizer and no client text in its
logs. The second tier fuzzes every route from the app's own OpenAPI schema (schemathesis) and LibreTranslate's
fields (Hypothesis strategies) against a real server."""

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time

import httpx
import pytest

from vaswani_hf.data.number_words import builtin_splits

from .helpers import grows_linearly
from .test_serve import Server

LINES = [source for source, _ in builtin_splits()["test"][:4]]
MEGABYTE = 1_000_000


@pytest.fixture(scope="module")
def server(model):
    """One server for the socket tests: limits that let a megabyte of markup reach the parser, and small line and
    queue bounds (--max_lines 50, --max_queue_lines 40)."""
    running = Server(model, "--max_chars", str(2 * MEGABYTE), "--max_body_bytes", str(4 * MEGABYTE), "--max_lines",
                     "50", "--max_queue_lines", "40")  # fmt: skip
    # the first request imports the sentence splitter and starts the worker threads: not what the tests time
    html = {"q": f"<p>{LINES[0]}</p>", "source": "en", "target": "de", "format": "html"}
    assert running.post("/translate", json=html).status_code == 200
    yield running
    assert running.stop()[0] == 0


def call(service, *requests, app=None):
    """The app's answers to (method, path, httpx keyword arguments) requests sent one after the other, in process."""
    from vaswani_hf.serving.app import create_app

    async def send():
        transport = httpx.ASGITransport(app=app or create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return [await client.request(method, path, **kwargs) for method, path, kwargs in requests]

    return asyncio.run(send())


def refused(answer: httpx.Response, status: int, *words: str) -> None:
    """A JSON refusal of this status whose message holds these words."""
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]
    for word in words:
        assert word in message, message


# --- defect 1: HTML parsed in linear time, off the event loop, after the characters are counted ------------------

SHAPES = {  # name -> the shape at about n characters
    # after white space, not a word: no text for the model, whose decoding (seconds on a busy machine) is not timed
    "unclosed tags": lambda n: "\n" + "<a " * (n // 3),
    "unclosed comment": lambda n: "<!--" + "x" * n,
    "nested marked sections": lambda n: "<![" * (n // 3),
    "bare <": lambda n: "<" * n,  # one text node of n characters: a line the model reads the first 1024 tokens of
    "deep nesting": lambda n: "<b>" * (n // 3),
    "many text nodes": lambda n: "<b>x" * (n // 4),
    "unclosed quotes": lambda n: '<a b="' * (n // 6),
    "unclosed script": lambda n: "<script>" + "<a " * (n // 3),
    # the tokenizer of our own took k * m steps here (100 KB in 25 s)
    "inline end tags past a block": lambda n: "<i><div>" + "<b>" * (n // 6) + "</i>" * (n // 8),
    "inline in block": lambda n: "<p><i>x<div>y</i>z</p>" * (n // 22),  # Lexbor: 250 KB in 3.8 s
    "divs": lambda n: "<div>" * (n // 5),  # Lexbor: 250 KB in 17.6 s
    "deep, then wide": lambda n: "<div>" * 250 + "x<br>" * (n // 5),
    "wide, kept": lambda n: "<pre>" + "x<br>" * (n // 5),
    "formatting misnested": lambda n: "<b><i><u><s>x</b>" * (n // 18),
    "links in links": lambda n: "<a>x" * (n // 4),
    "tables": lambda n: "<table><tr><td>x" * (n // 16),
    "entities": lambda n: "&amp;&#x41;&nbsp;&bogus;&#0;" * (n // 29),
    # lxml's iterwalk took time growing with the square of a run of sibling comments (the generator found it)
    "comments in a row": lambda n: "</a>" + "<?pi?><!--c-->" * (n // 14),
    # every parser measured compares a tag's attributes pairwise: 80,000 took libxml2 57 s, Lexbor 109 s
    "distinct attributes": lambda n: "<p " + " ".join(f"a{i}" for i in range(n // 7)) + ">x",
    "tags of many attributes": lambda n: ("<p " + " ".join(f"a{i}" for i in range(500)) + ">x</p>") * (n // 3400),
}


def read_html(markup: str, most: int | None = None) -> list[str]:
    """What serving does with a document: its text nodes read, the document written back (or it is refused)."""
    from vaswani_hf.serving.markup import BadMarkup, Document, TooManyTexts

    try:
        document = Document(markup, most)
    except (BadMarkup, TooManyTexts):
        return []
    texts = document.texts()
    document.render(texts)
    return texts


@pytest.mark.parametrize("shape", SHAPES)
def test_html_is_read_in_time_linear_in_its_size_whatever_its_shape(shape):
    grows_linearly(lambda size: read_html(SHAPES[shape](size)), MEGABYTE // 32)


def test_html_past_the_parser_s_bounds_is_refused_not_cut_short():
    from vaswani_hf.serving.markup import BadMarkup, Document

    assert Document("<div>" * 200 + "kept").texts() == ["kept"]
    for markup in ("<div>" * 300 + "lost?", SHAPES["inline end tags past a block"](MEGABYTE) + "lost?"):
        with pytest.raises(BadMarkup, match="nested deeper than 256"):
            Document(markup)
    assert Document("<p " + " ".join(f"a{i}" for i in range(512)) + ">kept").texts() == ["kept"]
    for quoted in ("", '=">"', "='<p'"):  # a quoted '>' or '<' does not end a tag, nor hide its attributes
        with pytest.raises(BadMarkup, match="more than 512 attributes"):
            Document("<p " + " ".join(f"a{i}{quoted}" for i in range(513)) + ">lost?")


HTML_PIECES = ["", "x", " ", "Hello world. ", "<p>", "</p>", "<div>", "</div>", "<i>", "</i>", "<b>", "</b>", "<a ",
               '<a href="x">', "</a>", "<br/>", "<!--", "-->", "<![", "<!DOCTYPE html>", "<?pi?>", "<", ">", "&amp;",
               "&nbsp;", "&bogus;", "&#", '"', "'", "=", "<script>", "</script>", "<pre>", "</pre>", "<table>",
               "<td>", "<li>", '<span translate="no">', '<p class="notranslate">', "</html>", "</body>", "<html>",
               "<title>", "<textarea>", "<svg>", "<math>", "<span/>", "\x00", "\u00a0"]  # fmt: skip


def test_html_of_any_shape_a_generator_draws_is_read_linearly_and_keeps_its_text():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from vaswani_hf.serving.markup import BadMarkup, Document, TooManyTexts

    @settings(max_examples=25, suppress_health_check=list(HealthCheck), **FUZZ_SETTINGS)
    @given(unit=st.lists(st.sampled_from(HTML_PIECES), max_size=8).map("".join),
           prefix=st.lists(st.sampled_from(HTML_PIECES), max_size=4).map("".join),
           most=st.none() | st.integers(0, 50))  # fmt: skip
    def check(unit, prefix, most):
        markup = prefix + unit * (2000 // max(1, len(unit)))
        try:
            document = Document(markup, most)
        except (BadMarkup, TooManyTexts):
            return
        texts = document.texts()
        assert all(text and text == text.strip() for text in texts)
        written = document.render(texts)
        if "\x00" not in markup:  # a NUL is U+FFFD once read, as the standard says
            assert Document(written).texts() == texts  # what is written back reads as the same text
        if unit:
            grows_linearly(lambda size: read_html(prefix + unit * (size // len(unit)), most), 25_000)

    check()


# the shapes whose text reaches the model are few and short (a megabyte of '<' is one line the model reads the
# first 1024 tokens of: tens of seconds of decoding, which is the model's cost of any long line, not the markup's)
SERVED_SHAPES = [shape for shape in SHAPES if shape not in ("bare <", "entities")]


@pytest.mark.parametrize("shape", SERVED_SHAPES)
def test_a_megabyte_of_pathological_html_is_answered_and_health_stays_answered(server, shape):
    latencies, done = [], threading.Event()

    def ping() -> None:
        while not done.is_set():
            start = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.02)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        answer = server.post(
            "/translate", json={"q": SHAPES[shape](MEGABYTE), "source": "en", "target": "de", "format": "html"}
        )
    finally:
        done.set()
        pinger.join()
    assert answer.status_code in (200, 400), answer.text  # 400: more text nodes than --max_lines, or past a bound
    if answer.status_code == 400:
        assert any(words in answer.json()["error"] for words in ("--max_lines", "cannot be read whole")), answer.text
    assert latencies  # /health answered throughout (the parsing's time is benchmarks/'s to measure, not a test's)


def test_html_characters_are_counted_as_sent_before_the_markup_is_parsed(service):
    markup = "<b>" * 2000  # 6,000 characters and not a word: LibreTranslate counts len(q), so does --max_chars
    text, page = call(service, ("POST", "/translate", {"json": {"q": markup, "source": "en", "target": "de",
                                                                "format": "html"}}),
                      ("POST", "/translate_file", {"data": {"source": "en", "target": "de"},
                                                   "files": {"file": ("page.html", markup.encode())}}))  # fmt: skip
    refused(text, 400, "request (6000) exceeds text limit (5000)", "--max_chars")
    refused(page, 400, "request (6000) exceeds text limit (5000)", "--max_chars")


# --- defect 2: the plain-text 500s, and their kin ----------------------------------------------------------------

JSON = {"content-type": "application/json"}
GOOD = {"q": "one", "source": "en", "target": "de"}


def raw(body: str | bytes, content_type: str = "application/json") -> dict:
    return {"content": body.encode() if isinstance(body, str) else body, "headers": {"content-type": content_type}}


BAD_INPUT = [
    # (route, httpx keyword arguments, the words the 400 names)
    ("/translate", raw('{"q": "one", "source": "en", "target": "de", "alternatives": Infinity}'), ["alternatives"]),
    ("/translate", raw('{"q": "one", "source": "en", "target": "de", "alternatives": NaN}'), ["alternatives"]),
    ("/translate", {"json": {**GOOD, "alternatives": [1]}}, ["alternatives"]),
    ("/detect", {"json": {"q": [1, 2]}}, ["q must be a text"]),
    ("/detect", {"json": {"q": {"a": 1}}}, ["q must be a text"]),
    ("/detect", {"json": {"q": 12}}, ["q must be a text"]),
    ("/translate", raw("[" * 100_000), ["JSON"]),
    ("/translate", raw('{"q": ' + "[" * 50_000 + "]" * 50_000 + ', "source": "en", "target": "de"}'), ["JSON"]),
    ("/translate", raw('{"q": "\\ud800", "source": "en", "target": "de"}'), ["q", "surrogate"]),
    ("/translate", raw('{"q": ["ok", "\\udfff"], "source": "en", "target": "de"}'), ["q", "surrogate"]),
    ("/translate", raw('{"q": "one", "source": "\\ud800", "target": "de"}'), ["source", "surrogate"]),
    ("/translate", raw('{"q": "one", "source": "en", "target": "de", "format": "\\ud800"}'), ["format"]),
    ("/detect", raw('{"q": "\\ud800"}'), ["q", "surrogate"]),
    ("/translate", {"json": {**GOOD, "q": [["nested"]]}}, ["q must be a text"]),
    ("/translate", {"json": {**GOOD, "q": 10**30}}, ["q must be a text"]),
    ("/translate", {"json": {**GOOD, "source": 5}}, ["source"]),
    ("/translate", {"json": {**GOOD, "target": ["de"]}}, ["target"]),
    ("/translate", {"json": {**GOOD, "source": "x" * 100_000}}, ["source"]),
    ("/translate", {"json": {**GOOD, "format": ["html"]}}, ["format"]),
    ("/translate", raw('{"q": "one", "alternatives": ' + "9" * 5000 + "}"), ["JSON"]),
    ("/translate", raw(b'{"q": "\xff\xfe", "source": "en", "target": "de"}'), ["JSON"]),
    ("/translate", raw(b"--x\r\nContent-Disposition: form-data\r\n\r\nq\r\n--x--", "multipart/form-data"), ["form"]),
    ("/translate", raw(b"garbage", "multipart/form-data; boundary=x"), []),
    ("/translate_file", raw(b"--x\r\n\r\n", "multipart/form-data; boundary=x"), []),
    ("/translate_file", {"json": GOOD}, ["file"]),
    ("/v1/translate", raw('{"texts": ["\\ud800"]}'), ["texts", "surrogate"]),
    ("/v1/translate", raw('{"texts": ["one"], "source": "\\ud800"}'), ["source", "surrogate"]),
    ("/v1/translate", raw('{"texts": ["one"], "beam_size": ' + "9" * 5000 + "}"), []),
    ("/v1/translate", raw("[" * 100_000), []),
    ("/v1/translate", {"json": {"texts": ["one"], "nbest": 10**30}}, ["nbest"]),
    ("/v1/translate", {"json": {"texts": ["one"], "length_penalty": False}}, ["length_penalty"]),  # the schema's types
    ("/v1/translate", {"json": {"texts": ["one"], "attention": 0}}, ["attention"]),
]


def test_hostile_fields_get_a_json_4xx_naming_them_never_a_5xx(service):
    answers = call(service, *[("POST", path, kwargs) for path, kwargs, _ in BAD_INPUT])
    for (path, kwargs, words), answer in zip(BAD_INPUT, answers, strict=True):
        case = f"{path} {str(kwargs)[:120]}: {answer.status_code} {answer.text[:300]}"
        assert 400 <= answer.status_code < 500, case
        message = answer.json()["error"]
        assert all(word in message for word in words), case
        assert len(message) < 1000, case  # a client's value is quoted cut short, if at all
    (fine,) = call(service, ("POST", "/translate", {"json": GOOD}))
    assert fine.status_code == 200


def test_odd_headers_and_form_bytes_are_not_5xx(service):
    answers = call(
        service,
        ("POST", "/translate", {"json": GOOD, "headers": {"authorization": b"Bearer \xff\x80"}}),
        ("POST", "/translate", raw(b"q=%FF%FE&source=en&target=de", "application/x-www-form-urlencoded")),
        ("POST", "/translate", {"json": GOOD, "headers": {"content-type": b"application/json; charset=\xff"}}),
        ("POST", "/translate", raw(b"q=one&source=en&target=de", "text/plain")),
        ("GET", "/v1/model?source=%FF&target=%00", {}),
        ("GET", "/download_file/..%2F..%2Fetc%2Fpasswd", {}),
    )
    for answer in answers:
        assert answer.status_code < 500, answer.text
        assert "error" in answer.json() or answer.status_code == 200, answer.text


def test_a_file_named_outside_latin1_is_translated_and_downloaded_with_rfc_5987_names(service):
    from vaswani_hf.serving.app import create_app

    app, files = create_app(service), {"file": ("文件.txt", LINES[0].encode())}
    (upload,) = call(service, ("POST", "/translate_file", {"data": {"source": "en", "target": "de"}, "files": files}),
                     app=app)  # fmt: skip
    assert upload.status_code == 200, upload.text
    url = upload.json()["translatedFileUrl"].removeprefix("http://serve")
    (download,) = call(service, ("GET", url, {}), app=app)
    assert download.status_code == 200 and download.text
    disposition = download.headers["content-disposition"]
    assert disposition == "attachment; filename=\"___de.txt\"; filename*=UTF-8''%E6%96%87%E4%BB%B6_de.txt"


def test_auto_names_what_the_client_asked_or_gives_text_in_the_target_back_unchanged(service):
    german = "Ein Mann in einem blauen Hemd steht auf einer Leiter und putzt die Fenster des Hauses."
    digits, hello, sure, unknown = call(
        service,
        *[("POST", "/translate", {"json": {"q": q, "source": "auto", "target": "en"}}) for q in ("123", "Hello")],
        ("POST", "/translate", {"json": {"q": german, "source": "auto", "target": "en"}}),
        ("POST", "/translate", {"json": {"q": "Hello", "source": "auto", "target": "fr"}}),
    )
    # nothing but English itself reaches English on an en->de server: the text is taken as English, and comes
    # back as it is (LibreTranslate's answer when source == target), never refused with a language not asked for
    assert digits.status_code == 200 and digits.json()["translatedText"] == "123", digits.text
    assert hello.status_code == 200 and hello.json()["translatedText"] == "Hello", hello.text
    refused(sure, 400, "German (de", "to English (en)")
    refused(unknown, 400, "fr is not supported")


# --- defect 3: sentences (the model's lines) counted before queueing; a request that never fits is a 4xx ---------


def test_sentences_over_max_lines_or_the_queue_are_refused_for_good_not_told_to_retry(server):
    many = "a! " * 1666  # one line of 4,998 characters: 1,666 sentences, each a line for the model
    libre = server.post("/translate", json={"q": many, "source": "en", "target": "de"})
    native = server.post("/v1/translate", json={"texts": [many]})
    refused(libre, 400, "1666 sentences", "--max_lines")
    refused(native, 413, "1666 sentences", "--max_lines")
    # 45 lines: within --max_lines (50), over what the queue ever holds (40)
    lines = "\n".join([LINES[0]] * 45)
    for answer in (server.post("/translate", json={"q": lines, "source": "en", "target": "de"}),
                   server.post("/v1/translate", json={"texts": [lines]})):  # fmt: skip
        assert answer.status_code in (400, 413) and "Retry-After" not in answer.headers, answer.text
        refused(answer, answer.status_code, "45 lines for the model", "--max_queue_lines", "cannot help")


def test_a_route_through_a_pivot_counts_its_lines_twice_against_the_queue(service, model, monkeypatch):
    from vaswani_hf.serving.app import create_app
    from vaswani_hf.serving.catalog import Catalog, ServedModel

    monkeypatch.setattr(service.settings, "max_queue_lines", 40)
    catalog = Catalog([ServedModel(str(model), "en", "de"), ServedModel(str(model), "de", "fr")], service.settings,
                      load=lambda _model, _metrics: service)  # fmt: skip
    catalog.ready = True
    lines = "\n".join([LINES[0]] * 25)  # 25 lines: 50 through the pivot (de), over the queue's 40
    (answer,) = call(service, ("POST", "/translate", {"json": {"q": lines, "source": "en", "target": "fr"}}),
                     app=create_app(catalog))  # fmt: skip
    refused(answer, 400, "50 lines for the model", "through a pivot", "--max_queue_lines")


# --- defect 4: /parse checks its size before tokenizing, and logs no client text above DEBUG -------------------


@pytest.fixture(scope="module")
def parse_service(tmp_path_factory):
    from vaswani_hf.serving.parsing_api import parse_batch
    from vaswani_hf.serving.service import Service, Settings
    from vaswani_hf.translation.inference import load_for_inference

    from .test_parser_api import build_model

    folder = build_model(tmp_path_factory.mktemp("hostile") / "parser")
    loaded, tokenizer = load_for_inference(folder, device="cpu", precision="fp32")
    service = Service(loaded, tokenizer, Settings(request_timeout=60), str(folder), "cpu", "fp32", ("en", "en"),
                      parse_batch)  # fmt: skip
    service.warm_up()
    yield service
    service.batcher.stop()


def test_parse_checks_its_size_before_tokenizing_and_logs_no_client_text(parse_service, monkeypatch, caplog):
    from vaswani_hf.serving import parsing_api
    from vaswani_hf.serving.app import create_app

    app = create_app(parse_service, parsing_api.parsing_routers)
    tokenized = []
    real = parsing_api.words_of
    monkeypatch.setattr(parsing_api, "words_of", lambda *args: tokenized.append(1) or real(*args))
    (big,) = call(parse_service, ("POST", "/parse", {"json": {"sentences": ["word " * 180_000]}}), app=app)
    refused(big, 413, "exceeds text limit (5000)", "--max_chars")
    assert not tokenized
    caplog.set_level(logging.DEBUG)
    secret = 'She said "private words" twice .'  # the tokenizer changes the quotes: logged, at DEBUG only
    (parsed,) = call(parse_service, ("POST", "/parse", {"json": {"sentences": [secret]}}), app=app)
    assert parsed.status_code == 200, parsed.text
    assert any("private words" in r.getMessage() for r in caplog.records)  # it was logged ...
    loud = [r for r in caplog.records if r.levelno > logging.DEBUG and "private" in r.getMessage()]
    assert not loud, [r.getMessage() for r in loud]  # ... but never above DEBUG


# --- defect 5: keys from the body or a header, never the query string ------------------------------------------


def test_a_key_in_the_query_string_is_refused_naming_the_fix_and_metrics_read_the_header(service, monkeypatch):
    monkeypatch.setattr(service.settings, "api_keys", frozenset({"secret"}))
    in_query, in_body, metrics_query, metrics_header, bearer, listed, health, languages = call(
        service,
        ("POST", "/translate?api_key=secret", {"json": GOOD}),
        ("POST", "/translate", {"data": {**GOOD, "api_key": "secret"}}),
        ("GET", "/metrics?api_key=secret", {}),
        ("GET", "/metrics", {"headers": {"authorization": "Bearer secret"}}),
        ("POST", "/v1/translate", {"json": {"texts": ["one"]}, "headers": {"authorization": "Bearer secret"}}),
        ("POST", "/translate", {"json": {**GOOD, "api_key": ["secret"]}}),
        ("GET", "/health?api_key=secret", {}),  # routes that need no key: the key is ignored, as the docs say
        ("GET", "/languages?api_key=secret", {}),
    )
    refused(in_query, 400, "api_key in the query string", "Authorization: Bearer")
    refused(metrics_query, 400, "api_key in the query string")
    refused(listed, 400, "api_key must be a string")
    assert in_body.status_code == metrics_header.status_code == bearer.status_code == 200
    assert health.status_code == languages.status_code == 200, (health.text, languages.text)


# --- defect 6 (second tier): property-based fuzzing of every route --------------------------------------------


FUZZ_SETTINGS = {"deadline": None, "derandomize": True, "database": None}


def alive(server: Server) -> None:
    assert server.process.poll() is None
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


# What OpenAPI cannot declare of a schema-valid request: a file part's name and bytes (/translate_file takes a
# .txt, .html or .htm name, UTF-8 text: schemathesis sends random bytes named `file`), so that route may refuse one
# 400; and --max_lines, a bound on the line breaks summed over a request's texts (and on their sentences once split),
# so the routes that take texts may refuse a schema-valid one as too long (400 LibreTranslate's, 413 the native
# API's). Every other check holds on them: no 5xx, answers as declared, schema-invalid requests refused.
SCHEMATHESIS_CONFIG = """[[operations]]
include-path = "/translate_file"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]

[[operations]]
include-path = "/translate"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]

[[operations]]
include-path = "/detect"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429", "5xx"]

[[operations]]
include-path = "/v1/translate"
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "403", "404", "409", "413", "429", "5xx"]
"""


@pytest.mark.extended
def test_every_route_holds_to_its_openapi_schema_under_schemathesis_checks_all(server, tmp_path):
    """schemathesis run --checks all (its coverage and fuzzing phases, schema-valid and schema-violating requests):
    no 5xx, every answer's status, content type and body declared, a request the schema allows taken, one it
    refuses refused; an answer within 120 s (the server's own --request_timeout is 60 s: a loaded machine's slow
    answer is no finding, a request past its deadline is)."""
    pytest.importorskip("schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    run = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{server.url}/openapi.json",
           "--checks", "all", "--max-response-time", "120", "--max-examples", "10", "--seed", "1",
           "--request-timeout", "150", "--generation-database", "none", "--no-color"]  # fmt: skip
    result = subprocess.run(run, capture_output=True, text=True, timeout=1800, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    alive(server)


@pytest.mark.extended
def test_libretranslate_fields_fuzzed_give_no_5xx(server):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    text = st.text(max_size=40) | st.sampled_from(["", " ", "\n", "<b>x</b>", "a! " * 30, "1" * 300])
    value = st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
        | st.floats(allow_nan=True, allow_infinity=True) | text,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=3),
        max_leaves=8,
    )  # fmt: skip
    code = st.sampled_from(["en", "de", "auto", "EN", " de ", "fr", "", "xx"]) | value
    form = st.sampled_from(["text", "html", ""]) | value
    fields = st.fixed_dictionaries({}, optional={"q": value | st.lists(text, max_size=5), "source": code,
                                                 "target": code, "format": form, "alternatives": value,
                                                 "api_key": value})  # fmt: skip
    flat = st.dictionaries(st.sampled_from(["q", "source", "target", "format", "alternatives"]), text, max_size=5)
    failures = []

    @settings(max_examples=500, suppress_health_check=list(HealthCheck), **FUZZ_SETTINGS)
    @given(path=st.sampled_from(["/translate", "/detect"]), body=fields, form=flat,
           how=st.sampled_from(["json", "form"]))  # fmt: skip
    def fuzz_fields(path, body, form, how):
        try:
            content = json.dumps(body).encode()
        except (ValueError, UnicodeEncodeError):
            return
        kwargs = raw(content) if how == "json" else {"data": form}
        answer = httpx.post(f"{server.url}{path}", timeout=30, **kwargs)
        if answer.status_code >= 500:
            failures.append(f"{path} {how} {content[:200]!r}: {answer.status_code} {answer.text[:200]}")

    @settings(max_examples=150, suppress_health_check=list(HealthCheck), **FUZZ_SETTINGS)
    @given(name=st.text(min_size=1, max_size=20), content=st.binary(max_size=200), form=flat,
           suffix=st.sampled_from([".txt", ".html", ".htm", ".pdf", ""]))  # fmt: skip
    def fuzz_files(name, content, form, suffix):
        files = {"file": (name + suffix, content)}
        answer = httpx.post(f"{server.url}/translate_file", data=form, files=files, timeout=30)
        if answer.status_code >= 500:
            failures.append(f"/translate_file {name + suffix!r} {content[:60]!r}: {answer.status_code} {answer.text}")
        elif answer.status_code == 200:
            url = answer.json()["translatedFileUrl"]
            download = httpx.get(url, timeout=30)
            if download.status_code != 200:
                failures.append(f"download of {name + suffix!r}: {download.status_code} {download.text[:200]}")

    fuzz_fields()
    fuzz_files()
    assert not failures, failures[:10]
    alive(server)


# --- what an attacker found in the first version, each a test that failed then -----------------------------------


def multipart_body(fields: dict[str, bytes], filename: bytes | None = None) -> bytes:
    parts = [b'--X\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (k.encode(), v) for k, v in
             fields.items()]  # fmt: skip
    if filename is not None:
        parts.append(b'--X\r\nContent-Disposition: form-data; name="file"; filename="%s"\r\n\r\nHello\r\n' % filename)
    return b"".join(parts) + b"--X--\r\n"


def test_a_form_charset_that_makes_a_lone_surrogate_is_a_json_400(service):
    headers = {"content-type": "multipart/form-data; boundary=X; charset=unicode_escape"}
    text = multipart_body({"q": b"Hello \\ud800", "source": b"en", "target": b"de"})
    named = multipart_body({"source": b"en", "target": b"de"}, filename=b"\\ud800.txt")
    for path, body in (("/translate", text), ("/translate_file", named)):
        (answer,) = call(service, ("POST", path, {"content": body, "headers": headers}))
        refused(answer, 400, "lone surrogate")


def test_the_sentence_splitter_is_linear_on_any_line():
    from vaswani_hf.serving.sentences import sentences_of

    line = '?"' * 50_000
    assert "".join(a + b + c for a, b, c in sentences_of(line, "en")) == line
    # sentencex alone is quadratic here (0.36 s, then 4.8 s on 2 cores): four times the text, four times the time
    grows_linearly(lambda size: sentences_of(line[:size], "en"), 25_000)


def test_a_translated_file_of_any_name_downloads_from_its_url(service):
    from vaswani_hf.serving.app import create_app

    app = create_app(service)
    for name in ("Report #3.txt", "q?x=1.txt", "50%41.txt", "a%2fb.txt"):
        files = {"file": (name, LINES[0].encode())}
        (upload,) = call(service, ("POST", "/translate_file", {"data": {"source": "en", "target": "de"},
                                                               "files": files}), app=app)  # fmt: skip
        url = upload.json()["translatedFileUrl"].removeprefix("http://serve")
        (download,) = call(service, ("GET", url, {}), app=app)
        assert download.status_code == 200, (name, url, download.text)


def test_a_form_keeps_every_character_but_turns_crlf_into_a_line_end(service):
    html = "<pre>a\r\n  b\r\n</pre><!-- a\u2028b --><p>Hi</p>\n"
    (answer,) = call(service, ("POST", "/translate", {"data": {"q": html, "source": "en", "target": "de",
                                                               "format": "html"}}))  # fmt: skip
    out = answer.json()["translatedText"]
    assert out.startswith("<pre>a\n  b\n</pre><!-- a\u2028b --><p>") and out.endswith("</p>\n")


@pytest.mark.parametrize(("markup", "translated", "written"), [
    ('<span translate="no"><div>Acme Widget</span> Pro Max</div>', [],  # the span's end ignored inside a div
     '<span translate="no"><div>Acme Widget Pro Max</div></span>'),
    ('<span class="notranslate"/>Acme Widget</span>', ["Acme Widget"],  # libxml2 closes `<x/>`, as XHTML means
     '<span class="notranslate"></span>Acme Widget'),
    ('<ul><li class="notranslate">Acme<li>Free shipping<li>Easy returns</ul>', ["Free shipping", "Easy returns"],
     '<ul><li class="notranslate">Acme</li><li>Free shipping</li><li>Easy returns</li></ul>'),
    ("<table><tr><td translate=no>SKU-42<td>Blue cotton shirt</table>", ["Blue cotton shirt"],
     '<table><tr><td translate="no">SKU-42</td><td>Blue cotton shirt</td></tr></table>'),
    ("<p translate=no>Acme<div>Free shipping</div>", ["Free shipping"],
     '<p translate="no">Acme</p><div>Free shipping</div>'),
    ("<dl><dt translate=no>Acme<dd>A widget</dl>", ["A widget"],
     '<dl><dt translate="no">Acme</dt><dd>A widget</dd></dl>'),
    ("<p>x <\u017f y z</p>", ["x <\u017f y z"], "<p>x &lt;\u017f y z</p>"),  # no tag starts with a long s
    ("<!-- c -->Hello<?pi?> world</html>again", ["Hello", "worldagain"],  # nothing after </html> is lost
     "<!-- c -->Hello<!--?pi?--> worldagain"),  # (a browser shows 'worldagain' too: the end tag is ignored)
    ('<DIV Class=x data-a="1 &amp; 2"><p title=\'a > b\'>One &amp; two</p><br/>&nbsp;', ["One & two"],
     '<div class="x" data-a="1 &amp; 2"><p title="a &gt; b">One &amp; two</p><br>\u00a0</div>'),
    ("<!DOCTYPE html><title>T</title><p>x", ["T", "x"],  # a document comes back whole
     "<!DOCTYPE html>\n<html><head><title>T</title></head><body><p>x</p></body></html>"),
    ("", [], ""),
    ("<!DOCTYPE html>", [], "<!DOCTYPE html>"),
])  # fmt: skip
def test_the_parser_reads_the_elements_as_a_browser_and_writes_them_back_in_its_form(markup, translated, written):
    from vaswani_hf.serving.markup import Document

    document = Document(markup)
    assert document.texts() == translated
    assert document.render(document.texts()) == written


def test_auto_with_html_reads_the_text_not_the_markup(service):
    spanish = "el perro corre rápidamente por el prado verde junto al río y la casa de mi abuela está en la montaña"
    html = f'<img alt="{spanish}"><p>Good morning, how are you today, my dear friend?</p>'
    (answer,) = call(service, ("POST", "/translate", {"json": {"q": html, "source": "auto", "target": "de",
                                                               "format": "html"}}))  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["detectedLanguage"]["language"] == "en"


def test_html_parsing_is_inside_the_request_s_deadline(service, monkeypatch):
    from vaswani_hf.serving import libretranslate

    class SlowDocument(libretranslate.Document):  # a parse that outlasts the request's time
        def __init__(self, *args) -> None:
            time.sleep(1.0)
            super().__init__(*args)

    monkeypatch.setattr(service.settings, "request_timeout", 0.3)
    monkeypatch.setattr(libretranslate, "Document", SlowDocument)
    html = {"q": f"<p>{LINES[0]}</p>", "source": "en", "target": "de", "format": "html"}
    (answer,) = call(service, ("POST", "/translate", {"json": html}))
    refused(answer, 504, "--request_timeout")


def test_past_the_deadline_no_document_s_parsing_starts_and_the_thread_is_let_go(service, monkeypatch):
    """A request's documents are parsed one by one in a worker thread: past its time (504), the one under way
    finishes (a parser cannot be stopped) and no other starts, so the thread is free for other requests."""
    from vaswani_hf.serving import libretranslate

    parsed = []

    class SlowDocument(libretranslate.Document):  # a parse of 0.2 s: the request's 0.5 s end among 20 of them
        def __init__(self, *args) -> None:
            time.sleep(0.2)
            parsed.append(args[0])
            super().__init__(*args)

    monkeypatch.setattr(service.settings, "request_timeout", 0.5)
    monkeypatch.setattr(libretranslate, "Document", SlowDocument)
    html = {"q": [f"<p>{LINES[0]}</p>"] * 20, "source": "en", "target": "de", "format": "html"}
    (answer,) = call(service, ("POST", "/translate", {"json": html}))
    refused(answer, 504, "--request_timeout")
    time.sleep(1.0)  # the document under way at the deadline ends meanwhile; the 19 others would take 3.8 s
    seen = len(parsed)
    time.sleep(1.0)
    assert len(parsed) == seen < 20, len(parsed)  # no parse started after the deadline's


def test_work_not_started_by_the_deadline_never_starts_and_steps_stop_at_it():
    """`within`: a job still waiting for a pool thread at the deadline is dropped; `each`'s steps after it are
    not started (TimeoutError in the thread, which then ends)."""
    from concurrent.futures import ThreadPoolExecutor

    from vaswani_hf.serving.guard import each, within

    started, release, steps = [], threading.Event(), []

    async def run():
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        busy = asyncio.ensure_future(asyncio.to_thread(release.wait, 30))  # the pool's one thread held
        with pytest.raises(TimeoutError):
            await within(time.monotonic() + 0.2, started.append, "started")
        release.set()
        await busy
        with pytest.raises(TimeoutError):
            await within(time.monotonic() + 0.3, each, lambda step: (time.sleep(0.1), steps.append(step)), range(50))

    asyncio.run(run())
    assert started == []
    time.sleep(0.5)
    assert len(steps) < 50 and steps == list(range(len(steps))), steps


@pytest.mark.parametrize("how", ["emptied", "another model's weights", "no tokenizer", "truncated weights"])
def test_the_check_before_an_unload_reads_what_the_load_will_read(model, tmp_path, how):
    import shutil

    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
    from vaswani_hf.serving.service import check_model_files
    from vaswani_hf.translation.inference import load_for_inference

    from .helpers import broken_copy

    check_model_files(str(model))  # the good folder passes
    folder = tmp_path / "broken"
    if how == "emptied":  # its files deleted, the folder kept
        folder.mkdir()
    elif how == "another model's weights":  # a valid safetensors file of another model in its place
        shutil.copytree(model, folder)
        other = tmp_path / "other"
        VaswaniForConditionalGeneration(VaswaniConfig.tiny(vocab_size=50)).save_pretrained(other)
        shutil.copy(other / "model.safetensors", folder / "model.safetensors")
    else:
        broken_copy(model, folder, how)
    with pytest.raises(ValueError):  # (the catalog then closes no model for it)
        check_model_files(str(folder))
    with pytest.raises((ValueError, OSError)):  # ... and rightly: its load fails
        load_for_inference(folder, device="cpu", precision="fp32")


def test_a_client_s_share_counts_every_line_a_composed_request_sends_a_model(service, model, monkeypatch):
    from vaswani_hf.serving.app import create_app
    from vaswani_hf.serving.catalog import Catalog, ServedModel
    from vaswani_hf.serving.shares import ClientShares

    catalog = Catalog([ServedModel(str(model), "en", "de"), ServedModel(str(model), "de", "fr")], service.settings,
                      load=lambda _model, _metrics: service)  # fmt: skip
    catalog.ready = True
    held, hold = [], ClientShares.hold
    monkeypatch.setattr(ClientShares, "hold", lambda self, client, lines, refused: held.append(lines) or
                        hold(self, client, lines, refused))  # fmt: skip
    two = {"q": f"{LINES[0]}\n{LINES[1]}", "source": "en", "target": "fr", "alternatives": 3}
    (answer,) = call(service, ("POST", "/translate", {"json": two}), app=create_app(catalog))
    assert answer.status_code == 200, answer.text
    assert held == [2 * 4]  # 2 lines to the first model, then their 4 candidates each to the second


def test_the_schema_declares_every_refusal_and_the_metrics_as_text(service):
    (schema,) = call(service, ("GET", "/openapi.json", {}))
    paths = schema.json()["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            if path not in ("/health", "/metrics"):
                assert {"400", "403", "404", "413", "429", "503", "504"} <= set(operation["responses"]), (path, method)
            for status, answer in operation["responses"].items():
                if status != "200" and status != "422":
                    assert "error" in answer["content"]["application/json"]["schema"]["properties"], (path, status)
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"], metrics
    # LibreTranslate's routes read their fields by hand: the schema names them all the same
    for path, required in (("/translate", ["q", "source", "target"]), ("/detect", ["q"]),
                           ("/translate_file", ["file", "source", "target"])):  # fmt: skip
        for kind, body in paths[path]["post"]["requestBody"]["content"].items():
            assert body["schema"]["required"] == required and "api_key" in body["schema"]["properties"], (path, kind)


def test_the_schema_declares_the_served_languages_and_the_server_s_bounds(service):
    """What the server refuses of a request its schema allows is a schemathesis finding (ST202): the languages
    served, a text not empty, the server's --batch_limit, --max_nbest and --max_beam are in the schema."""
    settings, (schema,) = service.settings, call(service, ("GET", "/openapi.json", {}))
    paths = schema.json()["paths"]
    sources, targets = ["en", "de"], ["de", "en"]  # the model's pair, and each language to itself
    for path in ("/translate", "/detect", "/translate_file"):
        for body in paths[path]["post"]["requestBody"]["content"].values():
            fields = body["schema"]["properties"]
            if "source" in fields:
                assert fields["source"]["enum"] == ["auto", *sources] and fields["target"]["enum"] == targets
            if "q" in fields:  # a text, or a list (in a form, a list of one text is that text: not empty)
                text, *lists = fields["q"]["anyOf"]
                assert text["minLength"] == 1 and all(texts["minItems"] >= 1 for texts in lists), lists
                assert max(texts["maxItems"] for texts in lists) == settings.batch_limit, lists
    alternatives = paths["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"][
        "alternatives"]["anyOf"]  # fmt: skip
    assert alternatives[0] == {"type": "integer", "maximum": settings.max_nbest - 1}
    assert alternatives[1] == {"type": "number", "exclusiveMaximum": settings.max_nbest}
    native = schema.json()["components"]["schemas"]["NativeRequest"]["properties"]
    assert native["nbest"]["maximum"] == settings.max_nbest, native["nbest"]
    assert native["beam_size"]["anyOf"][0]["maximum"] == settings.max_beam, native["beam_size"]
    for field, codes in (("source", sources), ("target", targets)):
        assert native[field]["anyOf"][0]["enum"] == [*codes, ""], native[field]  # empty: the first model's
        (parameter,) = [p for p in paths["/v1/model"]["get"]["parameters"] if p["name"] == field]
        assert parameter["schema"]["anyOf"][0]["enum"] == [*codes, ""], parameter
    # the pairs served (de->en is not): each direct, the identity without attention; the LibreTranslate routes' auto
    pairs = [{name: rule["enum"] for name, rule in pair["properties"].items()}
             for pair in schema.json()["components"]["schemas"]["NativeRequest"]["anyOf"]]  # fmt: skip
    assert sorted(pairs, key=str) == sorted([{"source": ["en", None, ""], "target": ["de", None, ""]},
                                             {"source": ["en", None, ""], "target": ["en"], "attention": [False]},
                                             {"source": ["de"], "target": ["de", None, ""], "attention": [False]}],
                                            key=str)  # fmt: skip
    translate = paths["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]["anyOf"]
    assert {"source": {"enum": ["auto"]}} in [pair["properties"] for pair in translate] and len(translate) == 4


def test_a_composed_pair_goes_through_another_pivot_while_its_first_is_failing(service, model):
    from vaswani_hf.serving.app import create_app
    from vaswani_hf.serving.catalog import Catalog, ServedModel

    served = [ServedModel(str(model), *pair) for pair in (("en", "de"), ("de", "fr"), ("en", "es"), ("es", "fr"))]
    catalog = Catalog(served, service.settings, load=lambda _model, _metrics: service)
    catalog.ready = True
    best = catalog.route("en", "fr")
    catalog._failed(best.models[1], RuntimeError("the weights do not fit the config"))  # its second model is broken
    other = catalog.route("en", "fr")
    assert other.pivot not in (None, best.pivot), (best, other)
    (answer,) = call(service, ("POST", "/translate", {"json": {"q": LINES[0], "source": "en", "target": "fr"}}),
                     app=create_app(catalog))  # fmt: skip
    assert answer.status_code == 200, answer.text
    catalog._failed(other.models[0], RuntimeError("no config.json"))  # both pivots failing: the best is tried
    assert catalog.route("en", "fr") == best


def test_parse_s_schema_refuses_the_words_its_parser_refuses():
    from pydantic import ValidationError

    from vaswani_hf.serving.parsing_api import ParseRequest

    assert ParseRequest.model_validate({"sentences": [["a", "b"], "c d", ""]})  # strings, words and nothing
    for words in ([""], ["a b"], ["a\x1cb"]):  # what the schema allows, the server takes (schemathesis's check)
        with pytest.raises(ValidationError):
            ParseRequest.model_validate({"sentences": [words]})
