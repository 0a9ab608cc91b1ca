"""`vaswani serve` with models taking turns in memory (--max_loaded), models that fail to load, the start and the
stop, and slow or greedy clients: through real sockets and real signals, against tests/stub_serve.py's server,
whose stub models load, decode and unload in the times each test sets (seconds, not a model's minutes)."""

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .test_serve import _metric, free_port

A, B, C = ({"name": "en-de", "source": "en", "target": "de"}, {"name": "de-en", "source": "de", "target": "en"},
           {"name": "en-fr", "source": "en", "target": "fr"})  # fmt: skip


class Stub:
    """tests/stub_serve.py in its own process; `ready`: wait for /health 200 (else only for the port)."""

    def __init__(self, models: list[dict], ready: bool = True, hangup_ignored: bool = False, **spec) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        spec = {"models": models, **spec}
        # the server's SIGHUP set here, whatever this process's: ignored as nohup does, else at its default (a
        # terminal's). An ignored signal stays so across exec: a suite run under nohup would start servers that
        # ignore SIGHUP by design, and the SIGHUP test would wait for a stop that never comes
        hangup = signal.SIG_IGN if hangup_ignored else signal.SIG_DFL
        self.process = subprocess.Popen([sys.executable, "-m", "tests.stub_serve", str(self.port), json.dumps(spec)],
                                        stderr=subprocess.PIPE, text=True,
                                        preexec_fn=lambda: signal.signal(signal.SIGHUP, hangup))  # fmt: skip
        deadline = time.time() + 60
        while True:
            assert self.process.poll() is None, self.process.communicate()[1][-3000:]
            assert time.time() < deadline, "the stub server did not start in 60 s"
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200 or not ready:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)

    def translate(self, text: str, source: str, target: str, **kwargs) -> httpx.Response:
        return httpx.post(f"{self.url}/translate", json={"q": text, "source": source, "target": target},
                          timeout=60, **kwargs)  # fmt: skip

    def metric(self, name: str) -> float:
        return _metric(httpx.get(f"{self.url}/metrics").text, name)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def stop(self, timeout: float = 30) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout), self.process.communicate()[1]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def in_thread(work) -> tuple[threading.Thread, dict]:
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", work()))
    thread.start()
    return thread, out


def test_loading_and_unloading_never_stop_the_event_loop():
    """A model whose unload (freeing its memory) takes 2 s, and a load of 2 s: /health answers at once throughout."""
    with Stub([{**A, "unload_s": 2}, {**C, "load_s": 2}], max_loaded=1, preload=["en-de"]) as stub:
        thread, out = in_thread(lambda: stub.translate("hello", "en", "fr"))
        seen = set()  # (model, state) as /health told them: a loop held by the unload or the load answers none
        while thread.is_alive():
            health = stub.health()
            assert health["status"] == "ready"
            seen.update((model["model"], model["state"]) for model in health["models"])
            time.sleep(0.05)
        thread.join()
        assert out["result"].status_code == 200 and out["result"].json()["translatedText"] == "en-fr:hello"
        assert {("en-de", "unloading"), ("en-fr", "loading")} <= seen, seen
        assert stub.metric("vaswani_model_unloads_total") == 1 and stub.metric("vaswani_model_loads_total") == 2


async def _traffic(url: str, pairs: list[tuple[str, str]], every: float, count: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int):
            await asyncio.sleep(i * every)
            source, target = pairs[i % len(pairs)]
            return await client.post(f"{url}/translate", json={"q": f"line {i}", "source": source, "target": target})

        return await asyncio.gather(*(one(i) for i in range(count)))


def test_a_cold_pair_is_served_in_its_turn_under_steady_traffic_composed_pairs_too():
    """--max_loaded 1: four clients keep en->de busy; an en->fr request, and composed de->fr requests (de->en, then
    en->fr) sent every 20 ms, are each served in their turn: no 503, nothing lost."""
    models = [{**m, "load_s": 0.3, "batch_s": 0.05} for m in (A, B, C)]
    with Stub(models, max_loaded=1, preload=["en-de"], settings={"request_timeout": 30}) as stub:
        stop = threading.Event()

        def busy() -> list[int]:
            statuses = []
            while not stop.is_set():
                statuses.append(stub.translate("steady", "en", "de").status_code)
            return statuses

        clients = [in_thread(busy) for _ in range(4)]
        time.sleep(0.5)
        cold = stub.translate("cold", "en", "fr")
        composed = asyncio.run(_traffic(stub.url, [("de", "fr")], 0.02, 60))
        stop.set()
        for thread, _ in clients:
            thread.join()
        assert cold.status_code == 200 and cold.json()["translatedText"] == "en-fr:cold"
        assert [r.status_code for r in composed] == [200] * 60, [r.text for r in composed if r.status_code != 200]
        assert composed[7].json()["translatedText"] == "en-fr:de-en:line 7"
        steady = [status for _, out in clients for status in out["result"]]
        assert steady and set(steady) == {200}


def test_a_parser_takes_turns_with_a_translator_and_preload_keeps_the_bound():
    parser = {"name": "parser", "source": "en", "target": "en", "parser": True}
    with Stub([A, parser], max_loaded=1, preload=["en-de"], settings={"request_timeout": 10}) as stub:
        assert [m["loaded"] for m in stub.health()["models"]] == [True, False]  # the parser is not loaded past it
        for _ in range(2):
            parsed = httpx.post(f"{stub.url}/parse", json={"sentences": [["a", "dog"]]}, timeout=30)
            assert parsed.status_code == 200, parsed.text
            assert parsed.json()["parses"][0]["tree"] == "(TOP (S a dog))"
            translated = stub.translate("hello", "en", "de")
            assert translated.status_code == 200, translated.text
        assert stub.metric("vaswani_model_unloads_total") == 4


def test_a_model_that_fails_evicts_nothing_is_reported_and_retried_with_backoff_not_per_request():
    with Stub([A, {**C, "fail": "check"}, {**B, "fail": "load"}], max_loaded=1, preload=["en-de"]) as stub:
        health = stub.health()
        assert health["status"] == "degraded" and health["failed"] == ["en-fr"]  # found by its check at start
        for _ in range(3):  # alternating: the good model is never unloaded for the broken one
            broken = stub.translate("hello", "en", "fr")
            assert broken.status_code == 503 and "application/json" in broken.headers["content-type"]
            assert "en-fr" in broken.json()["error"] and "not a whole safetensors file" in broken.json()["error"]
            assert int(broken.headers["retry-after"]) >= 1
            assert stub.translate("hello", "en", "de").status_code == 200
        assert stub.metric("vaswani_model_loads_total") == 1 and stub.metric("vaswani_model_unloads_total") == 0
        failing = [stub.translate("hallo", "de", "en") for _ in range(3)]  # passes its check, fails to load
        assert [r.status_code for r in failing] == [503] * 3
        assert all("de-en" in r.json()["error"] and "do not fit" in r.json()["error"] for r in failing)
        assert stub.metric("vaswani_model_load_failures_total") == 2  # once at start (en-fr), once de-en: not 4
        described = {m["model"]: m for m in httpx.get(f"{stub.url}/v1/models").json()["models"]}
        assert described["de-en"]["state"] == "failed" and "do not fit" in described["de-en"]["failure"]["cause"]
        assert described["en-fr"]["failure"]["retry_in"] >= 1


def test_health_answers_loading_with_progress_while_the_models_preload():
    with Stub([{**A, "load_s": 3}, C], ready=False, preload=["en-de", "en-fr"]) as stub:
        first = httpx.get(f"{stub.url}/health", timeout=5)
        assert first.status_code == 503 and first.json()["status"] == "loading"
        assert first.json()["progress"]["of"] == 2 and first.json()["progress"]["loading"] == "en-de"
        early = stub.translate("hello", "en", "de")
        assert early.status_code == 503 and "retry-after" in early.headers


@pytest.mark.parametrize("busy", ["a request in flight", "a load under way"])
def test_sigterm_stops_within_the_drain_bound_whatever_is_running(busy):
    spec = ({"models": [{**A, "batch_s": 60}], "ready": True} if busy == "a request in flight"
            else {"models": [{**A, "load_s": 60}], "ready": False, "preload": ["en-de"]})  # fmt: skip
    with Stub(**spec, settings={"drain_seconds": 2}) as stub:
        if busy == "a request in flight":
            thread, out = in_thread(lambda: stub.translate("hello", "en", "de"))
            time.sleep(0.5)
        start = time.monotonic()
        code, _ = stub.stop()
        assert code == 0 and time.monotonic() - start < 2 + 3 + 1.5
        if busy == "a request in flight":  # cut off by the stop: told so, in JSON, and where to go
            thread.join()
            cut = out["result"]
            assert cut.status_code == 503 and "stopped before answering" in cut.json()["error"]
            assert cut.headers["retry-after"] == "5"


def test_a_second_signal_exits_at_once():
    with Stub([{**A, "batch_s": 60}]) as stub:  # the default drain: 20 s
        in_thread(lambda: stub.translate("hello", "en", "de"))
        time.sleep(0.5)
        stub.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        start = time.monotonic()
        stub.process.send_signal(signal.SIGINT)
        assert stub.process.wait(timeout=10) == 128 + signal.SIGINT and time.monotonic() - start < 2


def test_slow_clients_are_cut_off_and_connections_bounded():
    settings = {"header_timeout": 1, "body_timeout": 1, "max_connections": 4}
    with Stub([{**A, "batch_s": 2}], settings=settings) as stub:
        with socket.create_connection(("127.0.0.1", stub.port)) as headers:  # slowloris: a header byte at a time
            start = time.monotonic()
            headers.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n")
            with pytest.raises(OSError):
                for _ in range(40):
                    headers.sendall(b"X")
                    time.sleep(0.1)
                    if headers.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                        raise OSError("closed")
            assert time.monotonic() - start < 3
        with socket.create_connection(("127.0.0.1", stub.port)) as body:  # the body trickled
            body.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")  # fmt: skip
            answer = _answer(body)  # its headers and body may come in two reads; `Connection: close` ends it
            assert answer.startswith(b"HTTP/1.1 408") and b"--body_timeout" in answer, answer[:300]
        with socket.create_connection(("127.0.0.1", stub.port)) as steady:  # slow but steady: 3 s, a chunk a 0.5 s
            sent = json.dumps({"q": "steady", "source": "en", "target": "de"}).encode()
            steady.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(sent))  # fmt: skip
            for at in range(0, len(sent), len(sent) // 6 + 1):
                steady.sendall(sent[at : at + len(sent) // 6 + 1])
                time.sleep(0.5)
            steady.settimeout(10)
            assert steady.recv(4096).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)  # the connections above closed on the server's side too
        threads = [in_thread(lambda: stub.translate("hello", "en", "de")) for _ in range(3)]  # its own is the 4th
        time.sleep(0.5)
        assert stub.translate("one too many", "en", "de").status_code == 503  # uvicorn's limit_concurrency
        for thread, _ in threads:
            thread.join()
        assert {out["result"].status_code for _, out in threads} == {200}


def test_waiting_for_a_load_counts_in_the_queue_and_one_client_has_half_of_it():
    settings = {"max_queue_lines": 10, "max_client_lines": 5, "request_timeout": 20}
    with Stub([{**A, "load_s": 2}, {**C, "load_s": 3}], max_loaded=1, preload=["en-de"], settings=settings) as stub:
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
        waiting, out = in_thread(lambda: stub.translate("\n".join(["a"] * 5), "en", "fr"))  # waits for the load
        time.sleep(0.5)
        greedy = stub.translate("b", "en", "fr")  # the same client: its share is waiting
        assert greedy.status_code == 429 and "--max_client_lines" in greedy.json()["error"]
        second = other.post(f"{stub.url}/translate", json={"q": "\n".join(["c"] * 5), "source": "en", "target": "fr"})
        waiting.join()
        assert out["result"].status_code == 200 and second.status_code == 200
        third, held = in_thread(lambda: stub.translate("\n".join(["d"] * 5), "en", "de"))  # en-de, unloaded: waits
        time.sleep(0.3)
        full = other.post(f"{stub.url}/translate", json={"q": "\n".join(["e"] * 5) + "\nf", "source": "en",
                                                         "target": "de"})  # fmt: skip
        third.join()
        assert full.status_code == 429 and "--max_queue_lines" in full.json()["error"]  # 5 waiting + 6 > 10
        assert held["result"].status_code == 200


# What an attacker found in the first version of the turns, each a test that failed then.
def test_one_cold_model_closes_one_model_however_often_it_is_asked_for():
    models = [{**A, "unload_s": 2}, {**B, "unload_s": 2}, C]
    with Stub(models, max_loaded=2, preload=["en-de", "de-en"]) as stub:
        first, out = in_thread(lambda: stub.translate("one", "en", "fr"))
        time.sleep(0.3)
        second = stub.translate("two", "en", "fr")  # while en-de unloads
        first.join()
        assert second.status_code == 200 and out["result"].status_code == 200
        states = {m["model"]: m["state"] for m in stub.health()["models"]}
        assert states == {"en-de": "unloaded", "de-en": "loaded", "en-fr": "loaded"}
        assert stub.metric("vaswani_model_unloads_total") == 1


def test_an_unloaded_model_is_collected_when_it_unloads():
    with Stub([A, C], max_loaded=1, preload=["en-de"]) as stub:
        assert stub.translate("hello", "en", "fr").status_code == 200
        assert httpx.get(f"{stub.url}/stub/alive").json() == ["en-fr"]  # en-de's service is gone, not waiting for gc


def test_health_is_503_failed_when_no_model_can_serve():
    with Stub([{**A, "fail": "check"}], ready=False) as stub:
        deadline = time.time() + 30
        while (health := httpx.get(f"{stub.url}/health", timeout=5)).json()["status"] == "loading":
            assert time.time() < deadline
            time.sleep(0.05)
        assert health.status_code == 503 and health.json()["status"] == "failed"


def test_the_queue_bound_holds_across_models_and_a_client_that_hangs_up_gives_up_its_place():
    settings = {"max_queue_lines": 10, "max_batch_tokens": 1, "request_timeout": 30}
    models = [{**A, "batch_s": 1}, {**C, "load_s": 3}]
    with Stub(models, max_loaded=2, preload=["en-de"], settings=settings) as stub:
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30)
        waiting, _ = in_thread(lambda: stub.translate("\n".join(["w"] * 6), "en", "fr"))  # waits for en-fr
        time.sleep(0.5)
        full = other.post(f"{stub.url}/translate", json={"q": "\n".join(["x"] * 5), "source": "en", "target": "de"})
        assert full.status_code == 429 and "--max_queue_lines" in full.json()["error"]  # 6 waiting + 5 > 10
        waiting.join()
    with Stub([A, {**C, "load_s": 4}], max_loaded=1, preload=["en-de"], settings=settings) as stub:
        with socket.create_connection(("127.0.0.1", stub.port)) as gone:  # asks for en-fr, then hangs up
            body = json.dumps({"q": "\n".join(["g"] * 8), "source": "en", "target": "fr"}).encode()
            gone.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            time.sleep(0.5)
        time.sleep(0.5)
        assert stub.health()["queue"] == 0  # its 8 lines no longer count against the others
        assert stub.translate("\n".join(["h"] * 8), "en", "de").status_code == 200


def test_a_folder_broken_after_the_start_evicts_nothing():
    with Stub([A, {**C, "fail": "later"}], max_loaded=1, preload=["en-de"]) as stub:
        broken = stub.translate("hello", "en", "fr")
        assert broken.status_code == 503 and "not a whole safetensors file" in broken.json()["error"]
        assert stub.metric("vaswani_model_unloads_total") == 0 and stub.health()["models"][0]["state"] == "loaded"


def test_pipelined_requests_cannot_keep_a_connection_past_the_header_timeout():
    with Stub([A], settings={"header_timeout": 1}) as stub:
        with socket.create_connection(("127.0.0.1", stub.port)) as held:
            held.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nX-Slow: ")
            held.settimeout(5)
            assert held.recv(65536).startswith(b"HTTP/1.1 200")
            start = time.monotonic()
            closed = False
            while time.monotonic() - start < 4 and not closed:
                try:
                    held.sendall(b"a")
                    closed = held.recv(1, socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
                time.sleep(0.2)
            assert closed and time.monotonic() - start < 3


def _answer(connection: socket.socket) -> bytes:
    """What the server sent on this connection until it closed it (10 s at most)."""
    connection.settimeout(10)
    answer = b""
    while chunk := connection.recv(65536):
        answer += chunk
    return answer


START = b"GET /health HTTP/1.1\r\nHost: x\r\n"
OVERSIZED = {  # what the client sends (never the headers' end), the option its 431 names (the default bounds)
    "a header of a mebibyte, streamed": (START + b"X-Big: " + b"a" * (1 << 20), "--max_header_bytes"),
    "a long request line": (b"GET /health?" + b"a" * 100_000 + b" HTTP/1.1\r\n", "--max_header_bytes"),
    "many header fields": (START + b"".join(b"X-%d: v\r\n" % i for i in range(120)), "--max_headers"),
}


def _refused_431(port: int, case: str) -> None:
    """OVERSIZED[case] sent on a connection of its own, as a client writes (a chunk at a time): a JSON 431 naming
    the option passed, then the connection closed."""
    sent, option = OVERSIZED[case]
    with socket.create_connection(("127.0.0.1", port)) as connection:
        try:
            for at in range(0, len(sent), 8192):
                connection.sendall(sent[at : at + 8192])
        except OSError:
            pass  # the server stopped reading: the answer is waiting
        answer = _answer(connection)
    assert answer.startswith(b"HTTP/1.1 431 "), (case, answer[:200])
    assert option in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"], case


def test_headers_past_their_bounds_get_431_at_once_and_the_server_serves_on():
    with Stub([A]) as stub:  # the default bounds: 64 KiB of request line and headers, 100 header fields
        for case in OVERSIZED:
            _refused_431(stub.port, case)
        # within the bounds: served (90 fields and httpx's 5, 63 KiB)
        fields = {f"X-{i}": "v" * 700 for i in range(90)}
        assert httpx.get(f"{stub.url}/health", headers=fields, timeout=10).status_code == 200
        assert stub.health()["status"] == "ready"


def test_health_answers_while_a_client_streams_its_headers_slowly():
    """The header parser reads what arrives and goes back to the loop: while one client trickles 60 KiB of header
    (within the bound), a second connection's /health is answered before the first client has sent its headers'
    end; then the slow request is served too."""
    with Stub([A]) as stub:
        finished = threading.Event()

        def trickle() -> bytes:
            with socket.create_connection(("127.0.0.1", stub.port)) as connection:
                connection.sendall(START + b"X-Big: ")
                for _ in range(60):
                    connection.sendall(b"a" * 1024)
                    time.sleep(0.1)
                finished.set()
                connection.sendall(b"\r\n\r\n")
                return _answer(connection)

        thread, out = in_thread(trickle)
        time.sleep(0.5)
        health = httpx.get(f"{stub.url}/health", timeout=10)
        assert health.status_code == 200 and not finished.is_set()
        thread.join()
        assert out["result"].startswith(b"HTTP/1.1 200"), out["result"][:200]


def test_the_header_bounds_hold_under_max_connections_and_many_connections_at_once():
    """--max_connections (uvicorn's limit, 503 past it) is judged once a request's headers are read: the header
    parser's bounds come first, for every connection at once, with the limit reached by idle ones meanwhile."""
    with Stub([A], settings={"max_connections": 2}) as stub:
        idle = [socket.create_connection(("127.0.0.1", stub.port)) for _ in range(2)]  # the limit, reached
        try:
            with ThreadPoolExecutor(9) as pool:  # three connections of each case at once
                list(pool.map(lambda case: _refused_431(stub.port, case), [*OVERSIZED] * 3))
        finally:
            for connection in idle:
                connection.close()
        time.sleep(0.5)  # the closed connections leave the count
        assert httpx.get(f"{stub.url}/health", timeout=10).status_code == 200


def test_one_deadline_bounds_a_request_across_its_load_its_queues_and_both_legs_of_a_pair():
    de_fr = {"name": "de-fr", "source": "de", "target": "fr", "batch_s": 2.5}
    with Stub([{**A, "load_s": 2.5, "batch_s": 2.5}, de_fr], preload=["de-fr"],
              settings={"request_timeout": 4}) as stub:  # fmt: skip
        cold = stub.translate("hello", "en", "de")  # a load of 2.5 s, then a batch of 2.5 s: past the 4 s
        assert cold.status_code == 504 and "--request_timeout" in cold.json()["error"], cold.text
        pair = stub.translate("hello", "en", "fr")  # through de: two batches of 2.5 s, each within 4 s
        assert pair.status_code == 504 and "--request_timeout" in pair.json()["error"], pair.text
        time.sleep(3)  # the batches the two requests started run to their end (a batch is not stopped midway)
        assert stub.translate("hallo", "de", "fr").status_code == 200  # one batch: within the bound


def test_sighup_drains_as_sigterm_and_a_body_still_uploading_gets_its_answer():
    with Stub([{**A, "batch_s": 1}], settings={"drain_seconds": 8, "body_timeout": 4}) as stub:
        thread, out = in_thread(lambda: stub.translate("hello", "en", "de"))  # in flight, in its batch
        body = json.dumps({"q": "slow", "source": "en", "target": "de"}).encode()
        with socket.create_connection(("127.0.0.1", stub.port)) as upload:
            upload.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:5]))  # fmt: skip
            time.sleep(0.5)
            stub.process.send_signal(signal.SIGHUP)  # the terminal that started it closed
            time.sleep(0.5)
            upload.sendall(body[5:])  # the rest of the body, within --body_timeout, after the signal
            answer = _answer(upload)
        thread.join()
        assert answer.startswith(b"HTTP/1.1 200") and b"en-de:slow" in answer, answer[:300]
        assert out["result"].status_code == 200
        assert stub.process.wait(timeout=30) == 0


def test_a_suite_run_under_nohup_still_starts_servers_that_sighup_stops():
    """The servers' SIGHUP is the tests' to set: this process's own, ignored under `nohup python -m pytest` (and
    inherited across exec), must not leave them ignoring it."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    try:
        stub = Stub([A])
    finally:
        signal.signal(signal.SIGHUP, previous)
    with stub:
        stub.process.send_signal(signal.SIGHUP)
        assert stub.process.wait(timeout=20) == 0


def test_under_nohup_sighup_stays_ignored():
    with Stub([A], hangup_ignored=True) as stub:
        stub.process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert stub.health()["status"] == "ready" and stub.translate("hello", "en", "de").status_code == 200
