"""`vaswani serve`: real server processes on free loopback ports (LibreTranslate's client, the native API, bad
input, keys, SIGTERM draining, equality with `vaswani translate`), and the app and batcher in process where a
fault must be injected (a failing batch, a slow one, a client that leaves)."""

import asyncio
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from vaswani_hf.data.number_words import builtin_splits
from vaswani_hf.serving.batching import DynamicBatcher

from .helpers import vaswani

LINES = [source for source, _ in builtin_splits()["test"][:12]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`vaswani serve` in its own process, ready when /health says so."""

    def __init__(self, model, *options: str) -> None:
        if "--precision" not in options:  # the answers are compared with fp32's: auto picks bf16 on some CPUs
            options = (*options, "--precision", "fp32")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        models = [str(m) for m in model] if isinstance(model, list | tuple) else [str(model)]  # one or several
        self.process = subprocess.Popen([sys.executable, "-m", "vaswani_hf.cli", "serve", *models, "--port",
                                         str(self.port), *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)  # fmt: skip
        deadline = time.time() + 180
        while True:
            assert self.process.poll() is None, self.process.communicate()[1][-3000:]
            if time.time() > deadline:
                self.process.kill()
                raise AssertionError("the server did not get ready in 180 s")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)

    def post(self, path: str, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", timeout=60, **kwargs)

    def stop(self) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=60)
        return self.process.returncode, stderr


@pytest.fixture(scope="module")
def server(model):
    running = Server(model, "--max_chars", "2000")
    yield running
    assert running.stop()[0] == 0


@pytest.fixture(scope="module")
def reference(model):
    """`vaswani translate` of LINES, an empty line and a repeated line among them."""
    lines = [*LINES[:5], "", *LINES[5:], LINES[0]]
    result = vaswani("translate", str(model), "--precision", "fp32", stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]
    return lines, result.stdout.split("\n")[: len(lines)]


def good_request_works(server: Server) -> None:
    answer = server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"})
    assert answer.status_code == 200 and answer.json()["translatedText"]


# --- LibreTranslate's API -------------------------------------------------------------------------------------


def test_an_unmodified_libretranslate_client_works(server, reference):
    client = LibreTranslateAPI(server.url)
    lines, expected = reference
    assert client.translate(lines[0], "en", "de") == expected[0]
    assert client.translate(lines[1], "auto", "de") == expected[1]
    # every language also translates to itself, as LibreTranslate's (the text comes back as it is)
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de", "en"]},
                                  {"code": "de", "name": "German", "targets": ["de"]}]  # fmt: skip


def test_json_form_and_query_string_requests_and_auto_source(server, reference):
    lines, expected = reference
    as_json = server.post("/translate", json={"q": lines[:3], "source": "auto", "target": "de", "format": "text"})
    detected = as_json.json()["detectedLanguage"]  # one detection for the list, as LibreTranslate makes it
    assert as_json.json()["translatedText"] == expected[:3] and detected == [detected[0]] * 3
    assert detected[0]["language"] == "en" and 50 < detected[0]["confidence"] <= 100
    as_form = server.post("/translate", data={"q": lines[0], "source": "en", "target": "de"})
    as_query = server.post("/translate", params={"q": lines[0], "source": "en", "target": "de"})
    assert as_form.json() == as_query.json() == {"translatedText": expected[0]}


def test_a_text_of_several_lines_comes_back_line_for_line_as_vaswani_translate_gives_it(server, reference):
    lines, expected = reference
    answer = server.post("/translate", json={"q": "\n".join(lines), "source": "en", "target": "de"})
    assert answer.json()["translatedText"] == "\n".join(expected)
    crlf = server.post("/translate", json={"q": "\r\n".join(lines[:3]), "source": "en", "target": "de"})
    assert crlf.json()["translatedText"] == "\n".join(expected[:3])


def test_concurrent_requests_are_batched_and_each_gets_what_vaswani_translate_gives(server, reference):
    pairs = [(line, out) for line, out in zip(*reference, strict=True) if line]  # an empty q is refused (400)
    lines, expected = [line for line, _ in pairs], [out for _, out in pairs]
    metrics = httpx.get(f"{server.url}/metrics").text
    before = _metric(metrics, "vaswani_batch_lines_count")

    def one(i: int) -> str:
        return server.post("/translate", json={"q": lines[i % len(lines)], "source": "en", "target": "de"}).json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(48)))
    assert [a["translatedText"] for a in answers] == [expected[i % len(lines)] for i in range(48)]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert _metric(metrics, "vaswani_batch_lines_count") - before < 48  # some requests shared a batch
    for name in ("vaswani_requests_total", "vaswani_batch_tokens_bucket", "vaswani_request_seconds_bucket",
                 "vaswani_output_tokens_total", "vaswani_queue_lines"):  # fmt: skip
        assert name in metrics, name


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


# --- the native API ---------------------------------------------------------------------------------------------


def test_the_native_api_gives_nbest_with_scores_and_is_documented(server, reference):
    lines, expected = reference
    answer = server.post("/v1/translate", json={"texts": lines[:2], "nbest": 3, "beam_size": 4})
    assert answer.status_code == 200, answer.text
    first = answer.json()["translations"][0]
    assert first["text"] == expected[0] and len(first["nbest"]) == 3 and first["nbest"][0]["text"] == expected[0]
    scores = [candidate["score"] for candidate in first["nbest"]]
    assert scores == sorted(scores, reverse=True) and first["score"] == scores[0]
    greedy = server.post("/v1/translate", json={"texts": lines[:1], "beam_size": 1}).json()["translations"][0]
    assert greedy["score"] is None  # greedy search ranks nothing
    spec = httpx.get(f"{server.url}/openapi.json").json()
    assert "/v1/translate" in spec["paths"] and "/translate" in spec["paths"]
    assert httpx.get(f"{server.url}/docs").status_code == 200
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ready" and health["device"] == "cpu" and health["precision"] == "fp32"


# --- bad input: a clear refusal, and the next request is served -----------------------------------------------


@pytest.mark.parametrize(
    ("path", "request_kwargs", "status", "message"),
    [
        ("/translate", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400,
         "Invalid JSON format"),
        ("/translate", {"json": ["one"]}, 400, "Invalid JSON format"),
        ("/translate", {"json": {"source": "en", "target": "de"}}, 400, "Invalid request: missing q parameter"),
        ("/translate", {"json": {"q": "", "source": "en", "target": "de"}}, 400, "missing q parameter"),
        ("/translate", {"json": {"q": "one", "target": "de"}}, 400, "Invalid request: missing source parameter"),
        ("/translate", {"data": {"q": "one", "source": "en"}}, 400, "Invalid request: missing target parameter"),
        ("/translate", {"json": {"q": 5, "source": "en", "target": "de"}}, 400, "q must be a text"),
        ("/translate", {"json": {"q": "one", "source": "fr", "target": "de"}}, 400, "fr is not supported"),
        ("/translate", {"json": {"q": "one", "source": "en", "target": "es"}}, 400, "es is not supported"),
        ("/translate", {"json": {"q": "one", "source": "de", "target": "en"}}, 400,
         "English (en) is not available as a target language from German (de)"),
        ("/translate", {"json": {"q": "one " * 501, "source": "en", "target": "de"}}, 400,
         "Invalid request: request (2004) exceeds text limit (2000)"),
        ("/translate", {"json": {"q": ["one"] * 65, "source": "en", "target": "de"}}, 400,
         "Invalid request: request (65) exceeds text limit (64)"),
        ("/translate", {"json": {"q": "one", "source": "en", "target": "de", "format": "xml"}}, 400,
         "xml format is not supported"),
        ("/translate", {"data": {"q": "one", "source": "en", "target": "de", "alternatives": "x"}}, 400,
         "Invalid request: alternatives parameter is not a number"),
        ("/translate", {"json": {"q": "one", "source": "en", "target": "de", "alternatives": 8}}, 400,
         "Invalid request: alternatives parameter must be <= 7"),
        ("/translate", {"json": {"q": "a\n" * 201, "source": "en", "target": "de"}}, 400, "at most 200 a request"),
        ("/detect", {"data": {"q": ""}}, 400, "Invalid request: missing q parameter"),
        ("/suggest", {"data": {"q": "one", "s": "eins", "source": "en", "target": "de"}}, 403,
         "Suggestions are disabled on this server."),
        ("/v1/translate", {"json": {"texts": "one"}}, 422, "texts"),
        ("/v1/translate", {"json": {"texts": ["one"], "beam_size": 0}}, 422, "beam_size"),
        ("/v1/translate", {"json": {"texts": ["one"], "beam_size": 17}}, 422, "beam_size 17 is over this server's "
         "limit of 16 (--max_beam)"),
        ("/v1/translate", {"json": {"texts": ["one"], "nbest": 9}}, 422, "limit of 8 (--max_nbest)"),
        ("/v1/translate", {"json": {"texts": ["one"], "length_penalty": 2.5}}, 422, "length_penalty"),
        ("/v1/translate", {"content": b'{"texts": ["one"], "length_penalty": NaN}',
                           "headers": {"content-type": "application/json"}}, 422, "length_penalty"),
        ("/v1/translate", {"json": {"texts": ["one " * 501]}}, 413, "exceeds text limit (2000)"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_by_name_and_the_server_goes_on(server, path, request_kwargs, status, message):
    answer = server.post(path, **request_kwargs)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]
    good_request_works(server)


# --- access ----------------------------------------------------------------------------------------------------


def test_api_keys_are_needed_when_given_and_cors_is_off_by_default(model, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("secret-1\n\nsecret-2\n")
    keyed = Server(model, "--api_keys", str(keys), "--cors_origins", "https://app.example")
    try:
        missing = keyed.post("/translate", json={"q": LINES[0], "source": "en", "target": "de", "api_key": ""})
        assert missing.status_code == 400  # LibreTranslate's: no key is 400, a wrong one 403
        assert missing.json() == {"error": "Please contact the server operator to obtain an API key"}
        wrong = keyed.post("/translate", json={"q": LINES[0], "source": "en", "target": "de", "api_key": "guess"})
        assert wrong.status_code == 403 and wrong.json() == {"error": "Invalid API key"}
        assert LibreTranslateAPI(keyed.url, api_key="secret-2").translate(LINES[0], "en", "de")
        assert keyed.post("/v1/translate", json={"texts": [LINES[0]]}).status_code == 400
        assert httpx.get(f"{keyed.url}/metrics").status_code == 400  # behind the key too (--open_metrics opens it)
        assert httpx.get(f"{keyed.url}/metrics", headers={"Authorization": "Bearer secret-1"}).status_code == 200
        bearer = keyed.post("/v1/translate", json={"texts": [LINES[0]]}, headers={"Authorization": "Bearer secret-1"})
        assert bearer.status_code == 200
        cors = httpx.options(f"{keyed.url}/translate", headers={"Origin": "https://app.example",
                                                                 "Access-Control-Request-Method": "POST"})  # fmt: skip
        assert cors.headers.get("access-control-allow-origin") == "https://app.example"
    finally:
        assert keyed.stop()[0] == 0


def test_cors_is_off_unless_asked(server):
    # (server.post: httpx's own 5 s timeout is a busy machine's decoding time, not this test's question)
    answer = server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"},
                         headers={"Origin": "https://elsewhere.example"})  # fmt: skip
    assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


# --- stopping ----------------------------------------------------------------------------------------------------


def test_sigterm_refuses_new_requests_finishes_those_in_flight_and_exits_0(model):
    running = Server(model, "--max_batch_tokens", "64", "--drain_seconds", "60", "--max_chars", "100000")
    long_text = "\n".join(LINES * 5)  # 60 lines in batches of a few: seconds of work
    results = {}

    def in_flight():
        results["answer"] = running.post("/translate", json={"q": long_text, "source": "en", "target": "de"})

    thread = threading.Thread(target=in_flight)
    thread.start()
    try:
        deadline = time.time() + 30
        while "vaswani_queue_lines 0.0" in httpx.get(f"{running.url}/metrics").text:  # until its lines are queued
            assert time.time() < deadline
            time.sleep(0.02)
        running.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = running.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"})
        assert late.status_code == 503 and "stopping" in late.json()["error"]
        thread.join(timeout=120)
        assert results["answer"].status_code == 200
        assert len(results["answer"].json()["translatedText"].split("\n")) == 60
        _, stderr = running.process.communicate(timeout=60)  # no second signal: it ends by itself
        assert running.process.returncode == 0, stderr[-3000:]
        assert "stopping: new requests get 503" in stderr
    finally:
        if running.process.poll() is None:
            running.process.kill()


def test_a_model_folder_without_its_languages_is_refused_by_name(model, tmp_path):
    import shutil

    from vaswani_hf.serving.service import model_languages

    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    (copy / "training_facts.json").unlink()
    assert model_languages(str(copy), None, None) == ("en", "de")  # its card's language list
    (copy / "README.md").unlink()
    result = vaswani("serve", str(copy), "--port", str(free_port()))
    assert result.returncode == 2 and "give --source and --target" in result.stderr


# --- in process: faults injected into the batch, time-outs, clients that leave -----------------------------------


def call(service, *requests):
    """The app's answers to (path, json) requests sent together, in process."""
    from vaswani_hf.serving.app import create_app

    async def send():
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))

    return asyncio.run(send())


def test_a_batch_that_fails_in_the_model_fails_its_requests_only(service, monkeypatch):
    real = service.batcher.translate
    failed = []

    def failing(texts, options):
        if not failed:
            failed.append(texts)
            raise RuntimeError("CUDA out of memory (injected)")
        return real(texts, options)

    monkeypatch.setattr(service.batcher, "translate", failing)
    (broken,) = call(service, ("/translate", {"q": LINES[0], "source": "en", "target": "de"}))
    assert broken.status_code == 500 and "RuntimeError: CUDA out of memory (injected)" in broken.json()["error"]
    (fine,) = call(service, ("/translate", {"q": LINES[0], "source": "en", "target": "de"}))
    assert fine.status_code == 200 and fine.json()["translatedText"]


def test_a_request_past_its_time_gets_504_and_the_next_one_is_served(service, monkeypatch):
    real = service.batcher.translate

    def slow_for_one(texts, options):
        if "slow" in texts:
            time.sleep(1.0)
        return real(texts, options)

    monkeypatch.setattr(service.batcher, "translate", slow_for_one)
    monkeypatch.setattr(service.settings, "request_timeout", 0.3)
    (slow,) = call(service, ("/translate", {"q": "slow", "source": "en", "target": "de"}))
    assert slow.status_code == 504 and "no translation within 0.3 s (--request_timeout)" in slow.json()["error"]
    assert float(slow.headers["server-timing"].removeprefix("app;dur=")) >= 300  # the time it was kept waiting
    monkeypatch.setattr(service.settings, "request_timeout", 30)
    (quick,) = call(service, ("/v1/translate", {"texts": [LINES[1]]}))
    assert quick.status_code == 200


def test_the_lines_of_a_request_that_left_are_dropped_from_the_queue():
    seen, gate = [], threading.Event()

    def translate(texts, options):
        gate.wait(5)
        seen.extend(texts)
        return texts

    batcher = DynamicBatcher(translate, len, max_batch_tokens=1, max_wait_ms=0)

    async def scenario():
        loop = asyncio.get_running_loop()
        first = batcher.submit(["a"], {}, loop)  # taken by the worker, which waits at the gate
        await asyncio.sleep(0.1)
        left = batcher.submit(["b", "c"], {}, loop)
        kept = batcher.submit(["d"], {}, loop)
        DynamicBatcher.abandon(left)  # its client disconnected
        gate.set()
        return [await line.future for line in first + kept]

    assert asyncio.run(scenario()) == ["a", "d"] and seen == ["a", "d"]
    batcher.stop()


def test_batches_hold_lines_of_similar_length_within_the_budget_and_results_come_back_in_order():
    batches = []

    def translate(texts, options):
        batches.append(list(texts))
        return [text.upper() for text in texts]

    texts = ["a" * n for n in (1, 9, 2, 8, 3, 7, 1, 9)]
    batcher = DynamicBatcher(translate, len, max_batch_tokens=18, max_wait_ms=50)

    async def scenario():
        lines = batcher.submit(texts, {}, asyncio.get_running_loop())
        return [await line.future for line in lines]

    assert asyncio.run(scenario()) == [text.upper() for text in texts]
    for batch in batches:
        assert len(batch) * max(map(len, batch)) <= 18 or len(batch) == 1
    assert sorted(batches[0], key=len) == ["a", "a", "aa", "aaa"]  # the oldest line and those nearest its length
    batcher.stop()


def _clients_in_turn(batcher: DynamicBatcher, starts: list[float], turnaround: float, rounds: int) -> list[str]:
    """Clients that each send one line (their number), wait for its answer, take `turnaround` seconds, and send the
    next, `rounds` times; client i starts at starts[i]."""

    async def client(number: int) -> None:
        await asyncio.sleep(starts[number])
        for _ in range(rounds):
            (line,) = batcher.submit([str(number)], {}, asyncio.get_running_loop())
            await line.future
            await asyncio.sleep(turnaround)

    async def scenario() -> None:
        await asyncio.gather(*(client(number) for number in range(len(starts))))

    asyncio.run(scenario())


def test_clients_slower_to_come_back_than_the_wait_still_share_one_batch():
    """Clients that come back 40 ms after their answers, past the 10 ms wait, split into two groups taking turns in
    half-full batches (a server at 32 clients held 16.8 lines a batch); after a batch, the next one waits for the
    lines of the clients it answered, up to a tenth of its time."""
    batches = []

    def translate(texts, options):
        batches.append(sorted(texts))
        time.sleep(1.0)  # a tenth of it (100 ms, ten times the wait) for the clients to come back
        return texts

    batcher = DynamicBatcher(translate, len, max_batch_tokens=4096, max_wait_ms=10)
    _clients_in_turn(batcher, [0.0] * 3 + [0.3] * 3, turnaround=0.04, rounds=3)  # half of them join late
    batcher.stop()
    # the late half joins the first half's second round (one batch of six, twice), and ends alone; taking turns
    # made six batches of three
    assert batches == [["0", "1", "2"], [str(n) for n in range(6)], [str(n) for n in range(6)], ["3", "4", "5"]]


def test_a_lone_client_s_next_line_does_not_wait_for_company():
    """One client in turn: its answered line was the batch, so its next line is all the batch waits for."""
    arrived, started = [], []

    def translate(texts, options):
        started.append(time.monotonic())
        return texts

    batcher = DynamicBatcher(translate, len, max_batch_tokens=4096, max_wait_ms=500)
    original = batcher.submit
    batcher.submit = lambda *args, **kwargs: (arrived.append(time.monotonic()), original(*args, **kwargs))[1]
    _clients_in_turn(batcher, [0.0], turnaround=0.0, rounds=4)
    batcher.stop()
    waits = [start - arrival for arrival, start in zip(arrived, started, strict=True)]
    assert waits[0] >= 0.45 and max(waits[1:]) < 0.25, waits  # the first waits the 500 ms; then its line is enough


def _wait_of_a_line_after_three_clients_left(first_batch_seconds: float, max_wait_ms: int) -> float:
    """Three clients' lines share a batch (it takes `first_batch_seconds`) and the clients leave; then one line
    comes alone: how long it waited for its batch."""
    arrived, started = [], []

    def translate(texts, options):
        started.append(time.monotonic())
        time.sleep(first_batch_seconds if len(started) == 1 else 0)
        return texts

    batcher = DynamicBatcher(translate, len, max_batch_tokens=4096, max_wait_ms=max_wait_ms)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        first = [line for text in "abc" for line in batcher.submit([text], {}, loop)]
        await asyncio.gather(*(line.future for line in first))
        arrived.append(time.monotonic())
        (line,) = batcher.submit(["d"], {}, loop)
        await line.future

    asyncio.run(scenario())
    batcher.stop()
    return started[1] - arrived[0]


def test_after_a_batch_whose_clients_do_not_come_back_a_line_waits_ten_times_the_wait_at_most():
    # a tenth of the 5 s batch (500 ms) is past the bound of ten waits
    waited = _wait_of_a_line_after_three_clients_left(5.0, max_wait_ms=20)
    assert 0.15 <= waited < 0.45, waited  # ten waits: 200 ms, not 500


def test_metrics_and_health_answer_while_loading(service, monkeypatch):
    from vaswani_hf.serving.app import create_app

    monkeypatch.setattr(service, "ready", False)

    async def send():
        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return (await client.get("/health"), await client.post("/v1/translate", json={"texts": ["one"]}))

    health, refused = asyncio.run(send())
    assert health.status_code == 503 and health.json()["status"] == "loading"
    assert refused.status_code == 503 and "loading" in refused.json()["error"]


def test_a_wait_of_zero_forms_each_batch_from_the_lines_waiting_then():
    """`--max_wait_ms 0`: after a batch of three clients' lines, one line arriving alone goes at once, not after
    a wait for the other two (docs/serving.md)."""
    waited = _wait_of_a_line_after_three_clients_left(1.0, max_wait_ms=0)
    assert waited < 0.05, waited


def test_a_burst_after_a_quiet_spell_shares_one_batch():
    """The wait for the answered clients lasts only its time after the batch: a line answered long ago must not
    send the first line of the next burst off alone, its companions behind it (an attacker's find)."""
    batches = []

    def translate(texts, options):
        batches.append(sorted(texts))
        time.sleep(0.3)
        return texts

    batcher = DynamicBatcher(translate, len, max_batch_tokens=4096, max_wait_ms=30)
    _clients_in_turn(batcher, [0.0], turnaround=0.0, rounds=1)
    time.sleep(1.0)
    _clients_in_turn(batcher, [0.002 * n for n in range(8)], turnaround=0.0, rounds=1)
    batcher.stop()
    assert batches == [["0"], [str(n) for n in range(8)]], batches


def test_a_request_with_lines_still_waiting_is_no_client_coming_back():
    """One request of six lines, four to a batch: its last two go as soon as the first four are done; counted as
    clients that would send more, they waited the whole wait after the batch for lines that never came."""
    ended, started = [], []

    def translate(texts, options):
        started.append(time.monotonic())
        time.sleep(2.0)  # the wait after it: 200 ms (a tenth, under ten times the 30 ms wait)
        ended.append(time.monotonic())
        return texts

    batcher = DynamicBatcher(translate, lambda text: 1, max_batch_tokens=4, max_wait_ms=30)

    async def scenario() -> None:
        lines = batcher.submit(list("abcdef"), {}, asyncio.get_running_loop())
        await asyncio.gather(*(line.future for line in lines))

    asyncio.run(scenario())
    batcher.stop()
    assert len(started) == 2 and started[1] - ended[0] < 0.1, (started, ended)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="bound_memory sets glibc's allocator alone")
def test_the_server_keeps_a_batch_s_tensors_on_the_heap():
    """bound_memory's fixed mmap threshold was 128 KiB: every tensor of a batch (a megabyte at 32 sentences, beam
    4) was mapped and its pages faulted in afresh at each step, and the server's batches took 1.5x as long as
    `vaswani translate`'s. A freed megabyte now comes back from the heap without page faults."""
    code = ("import resource, torch; from vaswani_hf.serving.server import bound_memory; bound_memory()\n"
            "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for _ in range(20):\n    x = torch.ones(256 * 1024); del x\n"  # 1 MiB, until the heap settles
            "before = faults()\n"
            "for _ in range(50):\n    x = torch.ones(256 * 1024); del x\n"
            "print(faults() - before)")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(result.stdout) < 50 * 256 / 10, result.stdout  # mapped afresh: 256 pages each time


def test_the_server_bounds_onednn_s_primitive_cache_unless_the_user_set_it():
    code = ("import os; from vaswani_hf.serving.server import bound_memory; bound_memory(); "
            "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")  # fmt: skip
    for given, expected in ((None, "16"), ("256", "256")):
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
        if given:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = given
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert result.stdout.strip() == expected


if __name__ == "__main__":
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", __file__, *sys.argv[1:]]))
