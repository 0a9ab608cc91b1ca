#!/usr/bin/env python
"""CTranslate2 as its users run it, for benchmarks/engines.py and benchmarks/serve_engines.py: a `vaswani export`
folder translated by `translate_batch` on the token ids our tokenizer gives (its `tokenizer.json`, read by the
`tokenizers` library: no torch, no Transformers in this process), as a whole process.

    python benchmarks/ct2_translate.py CT2_DIR --tokenizer MODEL_DIR [--input FILE] [--beams 4] [--batch-size 32]
        [--max-tokens 4096] [--threads 2] [--length-penalty 0.6] [--offset 50]   # one translation a line
    ... --loop                  # translate the input again and again, printing nothing (a CPU-bound neighbour)
    ... --serve PORT            # LibreTranslate's POST /translate on 127.0.0.1:PORT (stdlib HTTP server, backlog 128)

Batches as `vaswani translate` makes them: sentences sorted by token length, longest first, at most `--batch-size`
sentences and `--max-tokens` padded source tokens a batch. The output limit is source + `--offset` tokens, per batch
(CTranslate2 takes one `max_decoding_length` a call: the batch's longest source + offset; each output is then cut to
its own sentence's limit, as `generate()` limits it, so greedy outputs match while a short sentence that never ends
costs CTranslate2 more steps than it costs us). Beam search ranks by CTranslate2's score / length **
`--length-penalty`, not GNMT's ((5 + length) / 6) ** alpha. The output is decoded as `vaswani translate` decodes
it: special tokens skipped, stripped.

The server (`--serve`) answers `{"q": TEXT or [TEXTS], "source": ..., "target": ...}` with `{"translatedText": ...}`
and a `Server-Timing: app;dur=MS` header, as `vaswani serve`'s LibreTranslate API does, so one client loop drives
both. `--batching on` (default): a queue that one thread empties into batches (the oldest line waits at most
`--max-wait-ms` for others, at most `--batch-size` lines and `--max-tokens` padded tokens a batch), as `vaswani
serve` batches; `--batching off`: each request translated alone, one at a time (what LibreTranslate does through
argos-translate)."""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Ct2Translator:
    """A CTranslate2 export and our tokenizer: text in, text out."""

    def __init__(self, folder: str, model_dir: str, threads: int, beams: int = 1, length_penalty: float = 1.0,
                 offset: int = 50, batch_size: int = 32, max_tokens: int = 4096):  # fmt: skip
        import ctranslate2
        from tokenizers import Tokenizer

        self.translator = ctranslate2.Translator(folder, device="cpu", inter_threads=1, intra_threads=threads)
        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.beams, self.length_penalty, self.offset = beams, length_penalty, offset
        self.batch_size, self.max_tokens = batch_size, max_tokens

    def batches(self, encoded: list[list[str]]) -> list[list[int]]:
        """Indices in `vaswani translate`'s batches: longest first, `batch_size` sentences, `max_tokens` padded."""
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        batches, start = [], 0
        while start < len(order):
            size = min(self.batch_size, len(order) - start, self.max_tokens // max(len(encoded[order[start]]), 1))
            batches.append(order[start : start + max(size, 1)])
            start += max(size, 1)
        return batches

    def translate(self, lines: list[str]) -> list[str]:
        """One translation a line, in order; an empty (or blank) line gives an empty one, as in `vaswani translate`."""
        texts = [i for i, line in enumerate(lines) if line.strip()]
        encoded = [self.tokenizer.encode(lines[i]).tokens for i in texts]
        outputs = [""] * len(lines)
        for batch in self.batches(encoded):
            sources = [encoded[i] for i in batch]
            results = self.translator.translate_batch(
                sources, beam_size=self.beams, length_penalty=self.length_penalty,
                max_decoding_length=max(map(len, sources)) + self.offset)  # fmt: skip
            for i, result in zip(batch, results, strict=True):
                # a sentence's own limit, as generate()'s: source + offset tokens, the last one the forced EOS
                kept = result.hypotheses[0][: len(encoded[i]) + self.offset - 1]
                ids = [self.tokenizer.token_to_id(token) for token in kept]
                outputs[texts[i]] = self.tokenizer.decode(ids, skip_special_tokens=True).strip()
        return outputs


class Batcher:
    """Lines from concurrent requests gathered into batches by one thread (`vaswani serve`'s policy)."""

    def __init__(self, translator: Ct2Translator, max_wait_ms: float):
        self.translator, self.max_wait = translator, max_wait_ms / 1000
        self.waiting: queue.Queue = queue.Queue()
        threading.Thread(target=self.run, daemon=True).start()

    def translate(self, lines: list[str]) -> list[str]:
        items = [(line, len(self.translator.tokenizer.encode(line).ids), threading.Event(), []) for line in lines]
        for item in items:
            self.waiting.put(item)
        for _, _, done, _ in items:
            done.wait()
        return [answer[0] for _, _, _, answer in items]

    def run(self) -> None:
        carried = None  # a line that would have made the last batch too many tokens: it starts the next one
        while True:
            batch = [carried or self.waiting.get()]
            carried, deadline = None, time.perf_counter() + self.max_wait
            while len(batch) < self.translator.batch_size:
                try:
                    item = self.waiting.get(timeout=max(deadline - time.perf_counter(), 0))
                except queue.Empty:
                    break
                if max(length for _, length, _, _ in [*batch, item]) * (len(batch) + 1) > self.translator.max_tokens:
                    carried = item
                    break
                batch.append(item)
            try:
                texts = self.translator.translate([line for line, _, _, _ in batch])
            except Exception as error:  # the batch's requests are answered (with nothing), the thread lives on
                print(f"batch of {len(batch)} lines failed: {error!r}", file=sys.stderr, flush=True)
                texts = [""] * len(batch)
            for (_, _, done, answer), text in zip(batch, texts, strict=True):
                answer.append(text)
                done.set()


def serve(translator: Ct2Translator, port: int, batching: bool, max_wait_ms: float) -> None:
    """LibreTranslate's /translate (and a /health that answers 200) until killed."""
    batcher = Batcher(translator, max_wait_ms) if batching else None
    alone = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as httpx's clients expect

        def log_message(self, *args) -> None:
            pass

        def reply(self, status: int, body: dict, started: float) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Server-Timing", f"app;dur={(time.perf_counter() - started) * 1000:.3f}")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.reply(200 if self.path == "/health" else 404, {"status": "ok"}, time.perf_counter())

        def do_POST(self) -> None:
            started = time.perf_counter()
            fields = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path != "/translate" or "q" not in fields:
                self.reply(400, {"error": "POST /translate with a JSON body holding q"}, started)
                return
            texts = fields["q"] if isinstance(fields["q"], list) else [fields["q"]]
            if batcher is not None:
                answers = batcher.translate(texts)
            else:
                with alone:
                    answers = translator.translate(texts)
            self.reply(200, {"translatedText": answers if isinstance(fields["q"], list) else answers[0]}, started)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # 32 clients connect at once: the stdlib's listen backlog of 5 reset some of them (httpx.ReadError)
        request_queue_size = 128

    Server(("127.0.0.1", port), Handler).serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a `vaswani export` (CTranslate2) folder")
    parser.add_argument("--tokenizer", required=True, help="the model folder whose tokenizer.json made the ids")
    parser.add_argument("--input", help="one sentence a line (default: stdin)")
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--offset", type=int, default=50, help="output limit: source tokens + OFFSET")
    parser.add_argument("--loop", action="store_true", help="translate the input again and again, printing nothing")
    parser.add_argument("--serve", type=int, metavar="PORT", help="serve LibreTranslate's /translate on this port")
    parser.add_argument("--batching", choices=["on", "off"], default="on")
    parser.add_argument("--max-wait-ms", type=float, default=10.0)
    args = parser.parse_args(argv)
    translator = Ct2Translator(args.folder, args.tokenizer, args.threads, args.beams, args.length_penalty,
                               args.offset, args.batch_size, args.max_tokens)  # fmt: skip
    if args.serve is not None:
        serve(translator, args.serve, args.batching == "on", args.max_wait_ms)
        return
    with open(args.input, encoding="utf-8") if args.input else sys.stdin as source:
        lines = source.read().splitlines()
    for _ in itertools.count() if args.loop else range(1):
        outputs = translator.translate(lines)
    print("\n".join(outputs), flush=True)


if __name__ == "__main__":
    main()
