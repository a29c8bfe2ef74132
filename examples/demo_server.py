"""A tiny payments API for the quickstart, built on the standard library only.

It honours ``Idempotency-Key`` like a real provider: the first request with a
key is executed (a "charge") and its answer stored; a retry with the same key
gets the stored answer marked ``Idempotent-Replayed: true``. With
``lose_first_response=True`` it charges on the first request and then hangs up
without answering, the way a network that lies behaves.

``GET /v1/payment_intents/search?query=metadata['order_id']:'A1'`` finds the
charges whose JSON body carried ``{"metadata": {"order_id": "A1"}}``, the way
Stripe's Search API does: what a reconciler asks when an answer left a charge
unknown.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# The one search query the demo understands: Stripe's metadata equality clause.
_ORDER_QUERY = re.compile(r"metadata\['order_id'\]:'([^']*)'")


@dataclass
class DemoAPI:
    url: str
    lose_first_response: bool
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    charges: int = 0
    answers: dict[str, bytes] = field(default_factory=dict)
    lost: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _handler(api: DemoAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            key = self.headers.get("Idempotency-Key")
            with api.lock:
                stored = api.answers.get(key) if key else None
                if stored is None:
                    api.charges += 1
                    stored = json.dumps(
                        {"id": f"pi_{api.charges}", "status": "succeeded", **json.loads(body)}
                    ).encode()
                    if key:
                        api.answers[key] = stored
                    if api.lose_first_response and api.lost == 0:
                        api.lost += 1
                        self.close_connection = True  # charged, but the answer is lost
                        return
                    replayed = False
                else:
                    replayed = True
            self._answer(200, stored, replayed=replayed)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            found = _ORDER_QUERY.fullmatch(parse_qs(url.query).get("query", [""])[0])
            if url.path != "/v1/payment_intents/search" or found is None:
                self._answer(404, b'{"error": {"type": "invalid_request_error"}}')
                return
            with api.lock:
                charges = [json.loads(answer) for answer in api.answers.values()]
            data = [c for c in charges if c.get("metadata", {}).get("order_id") == found[1]]
            self._answer(200, json.dumps({"object": "search_result", "data": data}).encode())

        def _answer(self, status: int, body: bytes, *, replayed: bool = False) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def demo_server(*, lose_first_response: bool = False) -> Iterator[DemoAPI]:
    """Serve the demo API on 127.0.0.1 in a background thread."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    api = DemoAPI(
        url=f"http://127.0.0.1:{httpd.server_address[1]}", lose_first_response=lose_first_response
    )
    httpd.RequestHandlerClass = _handler(api)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        httpd.shutdown()
        httpd.server_close()
