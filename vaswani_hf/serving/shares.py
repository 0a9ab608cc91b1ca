"""Each client's share of the queue: a client (its address: behind a proxy, the address uvicorn reads from
X-Forwarded-For, which it trusts from the proxies --forwarded_allow_ips names) may have at most --max_client_lines
lines in flight (waiting for a batch, in one, or waiting for their model to load), half the queue by default (and at
least one request's --max_lines). Past it, 429 with Retry-After: one client sending as fast as it can fills its
share, and the others still find room in the queue (LibreTranslate limits a client by its address where it sends no
key, too)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from .guard import ApiError


class ClientShares:
    """The lines in flight per client; `hold(client, lines)` counts a request's lines while it is served."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.held: Counter[str] = Counter()  # only clients with lines in flight: bounded by the requests in flight

    @contextmanager
    def hold(self, client: str, lines: int, refused) -> Iterator[None]:
        """Count `lines` for `client` until the block ends; past its share, `refused()` is called (it counts the
        refusal) and 429 raised, before any work."""
        if self.held[client] and self.held[client] + lines > self.most:
            refused()
            raise ApiError(429, f"Slowdown: this client already has {self.held[client]} lines waiting, and a client "
                           f"may have {self.most} (--max_client_lines): retry in 1 s, or wait for your answers",
                           "client_share", {"Retry-After": "1"})  # fmt: skip
        self.held[client] += lines
        try:
            yield
        finally:
            self.held[client] -= lines
            if not self.held[client]:
                del self.held[client]
