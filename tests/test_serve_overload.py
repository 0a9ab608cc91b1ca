"""`vaswani serve` under overload and bad clients, against real server processes and real sockets: a full queue
refuses at once with Retry-After (429 LibreTranslate, 503 native) and counts what it shed; a client that closes its
connection has its waiting lines dropped before they reach the model; bodies over the bound are refused before they
are read; a line that fails alone fails only its own request; refusals while draining carry CORS headers."""

import asyncio
import json
import shutil
import signal
import socket
import threading
import time

import httpx

from vaswani_hf.data.number_words import builtin_splits

from .test_serve import Server, _metric, call

LINES = [source for source, _ in builtin_splits()["test"][:40]]


def metric(server: Server, name: str) -> float:
    return _metric(httpx.get(f"{server.url}/metrics").text, name)


def hold(server: Server, lines: list[str]) -> tuple[threading.Thread, dict]:
    """A request that keeps the only worker busy (batching off: one line a batch), in a thread."""
    out: dict = {}

    def send() -> None:
        out["answer"] = server.post("/translate", json={"q": "\n".join(lines), "source": "en", "target": "de"})

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.time() + 30
    while metric(server, "vaswani_queue_lines") == 0 and "answer" not in out:  # until its lines are queued
        assert time.time() < deadline
        time.sleep(0.01)
    return thread, out


def test_a_full_queue_refuses_at_once_with_retry_after_and_counts_what_it_shed(trained):
    server = Server(trained[0], "--max_batch_tokens", "1", "--max_queue_lines", "30", "--max_chars", "100000")
    try:
        thread, held = hold(server, LINES[:30])
        libre = server.post("/translate", json={"q": "\n".join(LINES[:5]), "source": "en", "target": "de"})
        native = server.post("/v1/translate", json={"texts": LINES[:5]})
        assert libre.status_code == 429 and libre.json()["error"].startswith("Slowdown: the server is over its limit")
        assert native.status_code == 503 and "--max_queue_lines" in native.json()["error"]
        assert 1 <= int(libre.headers["retry-after"]) <= 60 and 1 <= int(native.headers["retry-after"]) <= 60
        assert metric(server, "vaswani_shed_requests_total") == 2 and metric(server, "vaswani_shed_lines_total") == 10
        thread.join(timeout=120)
        assert held["answer"].status_code == 200  # the requests already queued are served
        assert server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"}).status_code == 200
    finally:
        assert server.stop()[0] == 0


def test_clients_that_close_their_sockets_never_reach_the_model(trained):
    server = Server(trained[0], "--max_batch_tokens", "1", "--max_chars", "100000", "--max_lines", "100")
    try:
        batches = metric(server, "vaswani_batch_lines_count")
        thread, held = hold(server, LINES)  # 40 one-line batches ahead of everyone else
        body = json.dumps({"q": "\n".join(LINES[:20]), "source": "en", "target": "de"}).encode()
        sockets = []
        for _ in range(20):
            client = socket.create_connection(("127.0.0.1", server.port))
            client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
            sockets.append(client)
        time.sleep(0.3)
        for client in sockets:
            client.close()
        thread.join(timeout=120)
        assert held["answer"].status_code == 200
        deadline = time.time() + 10
        while metric(server, "vaswani_dropped_lines_total") < 400:
            assert time.time() < deadline, metric(server, "vaswani_dropped_lines_total")
            time.sleep(0.05)
        next_one = server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"})
        assert next_one.status_code == 200
        # 40 batches for the held request, 1 for the next one: none for the 400 lines whose clients left
        assert metric(server, "vaswani_batch_lines_count") - batches == 41
    finally:
        assert server.stop()[0] == 0


def test_bodies_over_the_bound_are_refused_before_they_are_read(trained):
    server = Server(trained[0], "--max_body_bytes", "1000")
    try:
        big = {"q": "one " * 400, "source": "en", "target": "de"}
        libre = server.post("/translate", json=big)
        assert libre.status_code == 400 and "over 1000 bytes" in libre.json()["error"]
        assert server.post("/v1/translate", json={"texts": ["one " * 400]}).status_code == 413

        def chunks():  # no Content-Length: the bound holds as the body streams in
            for _ in range(100):
                yield b"x" * 100

        streamed = server.post("/translate", content=chunks(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 400 and "--max_body_bytes" in streamed.json()["error"]
        assert server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"}).status_code == 200
    finally:
        assert server.stop()[0] == 0


def test_a_line_that_fails_alone_fails_only_its_own_request(service, monkeypatch):
    real = service.batcher.translate
    seen = []

    def failing(texts, options):
        seen.append(list(texts))
        if "poison" in texts:
            raise RuntimeError("this line breaks the model (injected)")
        return real(texts, options)

    monkeypatch.setattr(service.batcher, "translate", failing)
    monkeypatch.setattr(service.batcher, "max_wait", 0.2)  # the two requests share a batch
    good, bad = call(service, ("/translate", {"q": LINES[0], "source": "en", "target": "de"}),
                     ("/translate", {"q": "poison", "source": "en", "target": "de"}))  # fmt: skip
    assert good.status_code == 200 and good.json()["translatedText"]
    assert bad.status_code == 500 and "this line breaks the model (injected)" in bad.json()["error"]
    assert sorted(seen[0]) == sorted([LINES[0], "poison"])  # they did share it, and were then tried alone


def test_a_too_long_line_with_long_lines_error_is_refused_before_it_is_queued(trained, tmp_path):
    shutil.copytree(trained[0], tmp_path / "model")
    settings = tmp_path / "model" / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "model_max_length": 12}))
    server = Server(tmp_path / "model", "--long-lines", "error")
    try:
        answer = server.post("/translate", json={"q": f"three\n{LINES[0]}", "source": "en", "target": "de"})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"].startswith("Invalid request: line 2 has ")
        assert "at most 12" in answer.json()["error"] and "--long-lines error" in answer.json()["error"]
        assert server.post("/translate", json={"q": "three", "source": "en", "target": "de"}).status_code == 200
    finally:
        assert server.stop()[0] == 0


def test_cors_star_answers_every_origin_and_refusals_while_draining_carry_it(trained):
    server = Server(trained[0], "--cors_origins", "*", "--max_batch_tokens", "1", "--drain_seconds", "60",
                    "--max_chars", "100000")  # fmt: skip
    try:
        origin = {"Origin": "https://anywhere.example"}
        answer = server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"}, headers=origin)
        assert answer.headers["access-control-allow-origin"] == "*"
        thread, held = hold(server, LINES[:20])
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late = server.post("/translate", json={"q": LINES[0], "source": "en", "target": "de"}, headers=origin)
        assert late.status_code == 503 and late.headers["access-control-allow-origin"] == "*"
        assert late.headers["retry-after"] and "stopping" in late.json()["error"]
        thread.join(timeout=120)
        assert held["answer"].status_code == 200
    finally:
        server.stop()


def test_the_native_api_can_return_the_cross_attention_of_the_best_translation(service):
    (answer,) = call(service, ("/v1/translate", {"texts": [f"{LINES[0]}\n\n{LINES[1]}"], "attention": True}))
    assert answer.status_code == 200, answer.text
    lines = answer.json()["translations"][0]["attention"]
    assert len(lines) == 3 and lines[1] == {"source_tokens": [], "target_tokens": [], "weights": []}
    for line in (lines[0], lines[2]):
        assert len(line["weights"]) == len(line["target_tokens"]) >= 1
        assert all(len(row) == len(line["source_tokens"]) and abs(sum(row) - 1) < 1e-2 for row in line["weights"])
        assert line["source_tokens"][-1] == line["target_tokens"][-1] == "</s>"


def test_the_cross_attention_of_a_line_of_sentences_is_each_sentence_s_over_its_own_tokens(service):
    """A line's sentences are decoded one by one (sentences.py): its attention is theirs side by side, each
    sentence's rows over its own source tokens, zeros over the others' (it was a 500: the joined line had none)."""
    first, second = f"{LINES[0]}.", f"{LINES[1]}."
    (whole,) = call(service, ("/v1/translate", {"texts": [f"{first} {second}"], "attention": True}))
    (alone,) = call(service, ("/v1/translate", {"texts": [first, second], "attention": True}))
    assert whole.status_code == alone.status_code == 200, whole.text
    (line,) = whole.json()["translations"][0]["attention"]
    one, two = (translation["attention"][0] for translation in alone.json()["translations"])
    for tokens in ("source_tokens", "target_tokens"):
        assert line[tokens] == one[tokens] + two[tokens]
    before, after = [0.0] * len(one["source_tokens"]), [0.0] * len(two["source_tokens"])
    assert line["weights"] == [row + after for row in one["weights"]] + [before + row for row in two["weights"]]


def test_the_page_and_the_model_facts_are_served(service):
    async def send():
        from vaswani_hf.serving.app import create_app

        transport = httpx.ASGITransport(app=create_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
            return await client.get("/"), await client.get("/v1/model")

    page, facts = asyncio.run(send())
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<script src=" not in page.text and "https://" not in page.text  # nothing from elsewhere: works offline
    facts = facts.json()
    assert (facts["source"], facts["target"], facts["source_name"]) == ("en", "de", "English")
    assert facts["parameters"] > 0 and facts["size"]["d_model"] > 0 and facts["char_limit"] == 5000
