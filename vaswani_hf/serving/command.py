"""`vaswani serve MODEL_DIR`: load the model once, warm it, then serve HTTP (uvicorn) until SIGTERM or SIGINT,
after which new requests get 503 and those in flight finish within --drain_seconds; the process then exits 0."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from ..cli_decoding import _add_decoding_job_options, _decoding, _load, at_least_one


def serve_command(argv: list[str]) -> int:
    try:
        import uvicorn
    except ImportError as err:
        raise ImportError(f"vaswani serve needs the serve extra ({err.name} is missing): pip install "
                          "\"vaswani-hf[serve]\"") from None  # fmt: skip
    from .app import create_app
    from .service import Service, Settings, model_languages

    parser = argparse.ArgumentParser(prog="vaswani serve", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", help="a saved model folder")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=5000, help="LibreTranslate's port by default")
    parser.add_argument("--max_batch_tokens", type=int, default=4096,
                        help="padded source tokens per batch (lines x longest); 1 turns batching off (one line a "
                        "batch)")  # fmt: skip
    parser.add_argument("--max_wait_ms", type=float, default=10.0,
                        help="how long the oldest waiting line waits for others to share its batch")  # fmt: skip
    parser.add_argument("--max_chars", type=at_least_one, default=5000, help="most characters per request (413)")
    parser.add_argument("--request_timeout", type=float, default=60.0, help="seconds a request may wait (504)")
    parser.add_argument("--drain_seconds", type=float, default=30.0,
                        help="after SIGTERM, how long requests in flight may take to finish")  # fmt: skip
    parser.add_argument("--api_keys", metavar="FILE", help="a file of API keys, one a line: requests without one "
                        "of them get 403 (default: no keys needed)")  # fmt: skip
    parser.add_argument("--cors_origins", default="", help="comma-separated origins allowed to call from a "
                        "browser (CORS; default: none)")  # fmt: skip
    parser.add_argument("--source", help="the source language code (default: the model's training facts)")
    parser.add_argument("--target", help="the target language code (default: the model's training facts)")
    _add_decoding_job_options(parser)
    args = parser.parse_args(argv)
    keys = frozenset()
    if args.api_keys:
        path = Path(args.api_keys)
        if not path.is_file():
            raise FileNotFoundError(f"--api_keys {path}: no such file.")
        keys = frozenset(line.strip() for line in path.read_text().splitlines() if line.strip())
        if not keys:
            raise ValueError(f"--api_keys {path} holds no key: one key a line.")
    languages = model_languages(args.model_dir, args.source, args.target)
    settings = Settings(max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms,
                        max_chars=args.max_chars, request_timeout=args.request_timeout,
                        drain_seconds=args.drain_seconds, api_keys=keys,
                        cors_origins=tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
                        long_lines=args.long_lines, decoding=_decoding(args))  # fmt: skip
    model, tokenizer, precision = _load(args, [args.model_dir])
    device = str(getattr(model, "device", "cpu"))
    service = Service(model, tokenizer, settings, args.model_dir, device, precision.name, languages)
    start = time.monotonic()
    service.warm_up()
    print(f"warmed up in {time.monotonic() - start:.1f} s; serving {languages[0]}->{languages[1]} on "
          f"http://{args.host}:{args.port} (LibreTranslate: POST /translate; POST /v1/translate; docs at /docs)",
          file=sys.stderr, flush=True)  # fmt: skip
    config = uvicorn.Config(create_app(service), host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=max(int(args.drain_seconds), 1))  # fmt: skip
    DrainingServer(config, service).run()
    service.batcher.stop()
    print("stopped", file=sys.stderr, flush=True)
    return 0


class DrainingServer:
    """uvicorn's server, whose first SIGTERM/SIGINT drains: the app answers new requests 503 while those in flight
    finish (at most --drain_seconds), then uvicorn shuts down. A second signal stops at once."""

    def __init__(self, config, service) -> None:
        import uvicorn

        service_ref = service

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                if service_ref.draining:
                    return super().handle_exit(sig, frame)
                service_ref.draining = True
                print("stopping: new requests get 503; waiting for those in flight", file=sys.stderr, flush=True)
                loop = asyncio.get_running_loop()  # the handler runs in the loop's thread, between its callbacks
                loop.call_soon_threadsafe(lambda: loop.create_task(self.drain()))

            async def drain(self) -> None:
                deadline = time.monotonic() + service_ref.settings.drain_seconds
                while service_ref.in_flight and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                self.should_exit = True

        self.server = Server(config)

    def run(self) -> None:
        self.server.run()
