"""`vaswani serve` of a parse model: `POST /parse` answers what `vaswani parse` writes for the same words (best,
n-best with scores, both searches), with /v1/translate's bounds, statuses, keys and metrics; a translator's routes
answer a 400 naming POST /parse; in process, a failing batch, a timeout and a server without NLTK; and the page at
`/` drawing the tree of what is typed (headless Chromium, as tests/test_serve_page.py)."""

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from vaswani_hf.parsing.trees import parse_tree

from .helpers import same_rows_but_scores, vaswani
from .test_parser_api import build_model
from .test_serve import Server, _metric

SENTENCES = [
    "The dog saw a cat with a hat.",
    ["He", "said", ",", "``", "It", "(", "really", ")", "rained", "''", "."],
    "",
    "x y",
    'She can\'t say "no" (again).',
]


def words_of(sentence) -> list[str]:
    """The words `vaswani parse` is given for a sentence: a string as the Penn Treebank tokenises it."""
    from vaswani_hf.parsing.parser import tokenize

    return tokenize(sentence) if isinstance(sentence, str) else sentence


@pytest.fixture(scope="module")
def parse_model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("served") / "parser")


@pytest.fixture(scope="module")
def server(parse_model):
    running = Server(parse_model, "--max_chars", "2000")
    yield running
    assert running.stop()[0] == 0


def reference(model, *options: str) -> list[list[str]]:
    """`vaswani parse --nbest 3` of SENTENCES' words: per sentence, its [tree, score] rows."""
    stdin = "".join(" ".join(words_of(s)) + "\n" for s in SENTENCES)
    result = vaswani("parse", str(model), "--precision", "fp32", "--nbest", "3", *options, stdin=stdin)
    assert result.returncode == 0, result.stderr[-3000:]
    rows: list[list[list[str]]] = [[] for _ in SENTENCES]
    for line in result.stdout.splitlines():
        index, tree, score = line.split(" ||| ")
        rows[int(index)].append([tree, score])
    return rows


def candidates(parse: dict) -> list[list[str]]:
    return [[c["tree"] or "", "" if c["score"] is None else f"{c['score']:.6f}"] for c in parse["nbest"] or [parse]]


@pytest.mark.parametrize("tree_search", ["constrained", "plain"])
def test_parse_answers_what_vaswani_parse_writes_for_the_same_words(server, parse_model, tree_search):
    pytest.importorskip("nltk")
    expected = reference(parse_model, "--tree_search", tree_search)
    answer = server.post("/parse", json={"sentences": SENTENCES, "nbest": 3, "tree_search": tree_search})
    assert answer.status_code == 200, answer.text
    parses = answer.json()["parses"]
    same_rows_but_scores([candidates(parse) for parse in parses], expected)  # the batches differ: see helpers
    for parse, sentence in zip(parses, SENTENCES, strict=True):
        assert parse["tree"] == parse["nbest"][0]["tree"] and parse["repaired"] == parse["nbest"][0]["repaired"]
        if sentence:
            escaped = [w.replace("(", "-LRB-").replace(")", "-RRB-") for w in words_of(sentence)]
            assert parse_tree(parse["tree"]).words() == escaped
        else:
            assert parse == {"tree": None, "score": None, "repaired": False, "nbest": [parse["nbest"][0]]}
    repaired = [parse["repaired"] for parse in parses]
    assert not any(repaired) if tree_search == "constrained" else any(repaired)  # an untrained model's outputs
    one = server.post("/parse", json={"sentences": [SENTENCES[0]], "tree_search": tree_search}).json()["parses"][0]
    assert one["tree"] == expected[0][0][0] and one["nbest"] is None


def test_concurrent_requests_are_batched_and_counted_under_parse(server, parse_model):
    expected = [rows[0][0] for rows in reference(parse_model)]
    before = httpx.get(f"{server.url}/metrics").text

    def one(i: int) -> str:
        return server.post("/parse", json={"sentences": [SENTENCES[i % len(SENTENCES)]]}).json()["parses"][0]["tree"]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(20)))
    assert [answer or "" for answer in answers] == [expected[i % len(SENTENCES)] for i in range(20)]
    after = httpx.get(f"{server.url}/metrics").text
    ok = 'vaswani_requests_total{api="parse",status="200"}'
    assert _metric(after, ok) - _metric(before, ok) == 20
    assert _metric(after, 'vaswani_request_seconds_count{api="parse"}') >= 20
    assert _metric(after, "vaswani_batch_lines_count") - _metric(before, "vaswani_batch_lines_count") < 20
    assert _metric(after, "vaswani_output_tokens_total") > _metric(before, "vaswani_output_tokens_total")


def test_what_is_served_and_the_page(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ready" and health["languages"] == ["en", "en"]
    facts = httpx.get(f"{server.url}/v1/model").json()
    assert facts["endpoint"] == "parse" and facts["max_nbest"] == 8
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and "drawTree" in page.text
    assert "/parse" in httpx.get(f"{server.url}/openapi.json").json()["paths"]


@pytest.mark.parametrize(
    ("request_kwargs", "status", "message"),
    [
        ({"json": {"sentences": "a b"}}, 422, "sentences"),
        ({"json": {"q": ["a b"]}}, 422, "sentences: Field required"),
        ({"json": {"sentences": [["two words", "b"]]}}, 422,
         "sentences.0: word 1 ('two words') is empty or holds white space"),
        ({"json": {"sentences": [["a", 5]]}}, 422, "sentences"),
        ({"json": {"sentences": ["a"], "nbest": 9}}, 422, "nbest 9 is over this server's limit of 8 (--max_nbest)"),
        ({"json": {"sentences": ["a"], "nbest": 0}}, 422, "nbest"),
        ({"json": {"sentences": ["a"], "beam_size": 17}}, 422, "beam_size 17 is over this server's limit of 16"),
        ({"json": {"sentences": ["a"], "tree_search": "greedy"}}, 422, "tree_search"),
        ({"json": {"sentences": ["a"], "length_penalty": 3}}, 422, "length_penalty"),
        ({"json": {"sentences": ["one " * 501]}}, 413, "request (2004) exceeds text limit (2000)"),
        ({"json": {"sentences": ["a"] * 201}}, 413, "the text has 201 lines; this server takes at most 200"),
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 422, "Invalid request"),
    ],
)  # fmt: skip
def test_a_bad_parse_request_is_refused_by_name_and_the_server_goes_on(server, request_kwargs, status, message):
    answer = server.post("/parse", **request_kwargs)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    assert server.post("/parse", json={"sentences": ["a b"]}).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/translate", {"q": "The dog barked .", "source": "en", "target": "de"}),
        ("POST", "/v1/translate", {"texts": ["The dog barked ."]}),
        ("GET", "/languages", None),
        ("POST", "/detect", {"q": "The dog barked ."}),
    ],
)
def test_a_translator_s_routes_say_to_post_parse(server, parse_model, method, path, body):
    answer = httpx.request(method, f"{server.url}{path}", json=body, timeout=30)
    assert answer.status_code == 400
    assert answer.json() == {"error": f"this server parses: {parse_model} is a constituency parser, not a "
                             'translation model. POST /parse with {"sentences": ["The dog barked ."]} for trees '
                             '(docs/serving.md, "Parsing")'}  # fmt: skip


def test_api_keys_and_metrics_guard_parse_as_they_guard_translation(parse_model, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("secret-1\n")
    keyed = Server(parse_model, "--api_keys", str(keys))
    try:
        body = {"sentences": [SENTENCES[3]]}
        missing = keyed.post("/parse", json=body)
        assert missing.status_code == 400
        assert missing.json() == {"error": "Please contact the server operator to obtain an API key"}
        wrong = keyed.post("/parse", json=body, headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
        right = keyed.post("/parse", json=body, headers={"Authorization": "Bearer secret-1"})
        assert right.status_code == 200 and right.json()["parses"][0]["tree"].startswith("(TOP ")
        assert httpx.get(f"{keyed.url}/metrics").status_code == 400
        metrics = httpx.get(f"{keyed.url}/metrics", headers={"Authorization": "Bearer secret-1"}).text
        assert _metric(metrics, 'vaswani_requests_total{api="parse",status="200"}') == 1
        for status in ("400", "403"):  # the refusals, counted under the parse API
            assert _metric(metrics, f'vaswani_requests_total{{api="parse",status="{status}"}}') == 1
    finally:
        assert keyed.stop()[0] == 0


# --- in process: the seam (create_app with a parser's routers), faults injected, no NLTK -------------------------


@pytest.fixture(scope="module")
def parse_service(parse_model):
    from vaswani_hf.serving.parsing_api import parse_batch
    from vaswani_hf.serving.service import Service, Settings
    from vaswani_hf.translation.inference import load_for_inference

    loaded, tokenizer = load_for_inference(parse_model, device="cpu", precision="fp32")
    service = Service(loaded, tokenizer, Settings(request_timeout=60), str(parse_model), "cpu", "fp32", ("en", "en"),
                      parse_batch)  # fmt: skip
    service.warm_up()
    yield service
    service.batcher.stop()


def call(service, *requests):
    """The app's answers to (path, json) requests sent together, in process, with a parser's routers."""
    from vaswani_hf.serving.app import create_app
    from vaswani_hf.serving.parsing_api import parsing_routers

    async def send():
        transport = httpx.ASGITransport(app=create_app(service, parsing_routers))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))

    return asyncio.run(send())


def test_in_process_a_failed_batch_a_timeout_and_a_server_without_nltk(parse_service, monkeypatch):
    (fine,) = call(parse_service, ("/parse", {"sentences": [["a", "b"]]}))
    assert fine.status_code == 200 and parse_tree(fine.json()["parses"][0]["tree"]).words() == ["a", "b"]
    real = parse_service.batcher.translate

    def failing(lines, options):
        raise RuntimeError("CUDA out of memory (injected)")

    monkeypatch.setattr(parse_service.batcher, "translate", failing)
    (broken,) = call(parse_service, ("/parse", {"sentences": ["a b"]}))
    assert broken.status_code == 500
    assert broken.json()["error"] == "parsing this request failed: RuntimeError: CUDA out of memory (injected)"

    def slow(lines, options):
        time.sleep(1.0)
        return real(lines, options)

    monkeypatch.setattr(parse_service.batcher, "translate", slow)
    monkeypatch.setattr(parse_service.settings, "request_timeout", 0.3)
    (late,) = call(parse_service, ("/parse", {"sentences": ["a b"]}))
    assert late.status_code == 504 and "no parse within 0.3 s (--request_timeout)" in late.json()["error"]
    monkeypatch.setattr(parse_service.batcher, "translate", real)
    monkeypatch.setattr(parse_service.settings, "request_timeout", 60)

    monkeypatch.setitem(sys.modules, "nltk", None)  # a server without the parse extra
    monkeypatch.setitem(sys.modules, "nltk.tokenize", None)
    words, string = call(parse_service, ("/parse", {"sentences": [["a", "b"]]}), ("/parse", {"sentences": ["a b"]}))
    assert words.status_code == 200
    assert string.status_code == 501 and 'pip install "vaswani-hf[parse]"' in string.json()["error"]
    assert "send each sentence as a list of words" in string.json()["error"]


# --- the page, in headless Chromium (the second tier: tests/extended_tier.txt) ------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, as tests/test_serve_page.py drives it (skipped without it)."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver", reason="the page test drives Chromium with selenium")
    from selenium.webdriver.chrome.service import Service as ChromeService

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.skip("no chromium and chromedriver on the PATH (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=ChromeService(driver_path), options=options)
    yield driver
    driver.quit()


def test_the_page_draws_the_tree_of_what_is_typed(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server.url}/")
    WebDriverWait(browser, 20).until(lambda d: d.find_element(By.ID, "doing").text == "Parse")
    assert browser.find_element(By.ID, "attention-block").is_displayed() is False
    assert browser.find_element(By.CSS_SELECTOR, "label[for=source]").text == "English sentence"
    text = "The dog saw a cat (with a hat)."
    browser.find_element(By.ID, "source").send_keys(text)
    expected = server.post("/parse", json={"sentences": [text], "nbest": 4}).json()["parses"][0]
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#tree svg") and d.find_element(By.ID, "translation").text
    )
    shown = browser.find_element(By.ID, "translation").text
    assert shown == expected["tree"]  # the brackets, as POST /parse gives them
    tree = parse_tree(shown)
    svg = browser.find_element(By.CSS_SELECTOR, "#tree svg")
    words = [node.get_property("textContent") for node in svg.find_elements(By.CSS_SELECTOR, "text.word")]
    labels = svg.find_elements(By.CSS_SELECTOR, "text.label")
    assert words == tree.words() == ["The", "dog", "saw", "a", "cat", "-LRB-", "with", "a", "hat", "-RRB-", "."]
    assert len(labels) == shown.count("(")  # a label a constituent, TOP included
    assert labels[-1].get_property("textContent") == "TOP"  # drawn last: the root, at the top
    assert len(svg.find_elements(By.TAG_NAME, "line")) == len(labels) - 1 + len(words)  # a line a child
    assert "The parse tree of" in svg.find_element(By.TAG_NAME, "title").get_property("textContent")
    assert browser.find_element(By.ID, "best-score").text.startswith("log-probability ")
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []
