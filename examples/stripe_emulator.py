"""A Stripe-shaped payments API for the examples, and ``serve()`` to run it on 127.0.0.1.

``StripeEmulator`` is a plain ASGI app (no dependencies). It serves
``POST /v1/payment_intents`` (form-encoded, as Stripe takes it, or JSON) and
``GET /v1/payment_intents`` (the ledger), wants ``Authorization: Bearer
sk_test_...``, and honours ``Idempotency-Key`` as Stripe documents it
(https://docs.stripe.com/api/idempotent_requests):

* the first request with a key is executed and its status and body are saved;
  a retry with the same key and parameters gets the saved answer again,
  marked ``Idempotent-Replayed: true``;
* the same key with other parameters: ``400``, ``type: idempotency_error``;
* the same key while the first request is still executing: ``409``,
  ``code: idempotency_key_in_use``;
* a request that fails validation is not saved: a retry runs afresh.

Switches for the examples: ``lose_answers`` (the next N charges are made but
their answers never arrive, so the client's read timeout fires),
``processing_seconds`` (a slow charge) and ``outage`` (every request gets a
``503``; nothing is charged). ``charges`` is the ledger of charges actually
made; ``keys_seen`` holds the ``Idempotency-Key`` of every request received.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qsl

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = "/v1/payment_intents"


@dataclass
class _Saved:
    """What Stripe keeps for one idempotency key."""

    params: dict[str, Any]
    done: asyncio.Event
    body: bytes = b""


def _error(status: int, type_: str, message: str, code: str | None = None) -> tuple[int, bytes]:
    error = {"type": type_, "message": message, **({"code": code} if code else {})}
    return status, json.dumps({"error": error}).encode()


def _params(body: bytes, content_type: str) -> dict[str, Any]:
    """Form fields (``metadata[order_id]=7`` nests, as in Stripe's encoding), or JSON."""
    if content_type.startswith("application/json"):
        parsed = json.loads(body or b"{}")
        return parsed if isinstance(parsed, dict) else {}
    params: dict[str, Any] = {}
    for name, value in parse_qsl(body.decode()):
        outer, _, inner = name.partition("[")
        if inner:
            params.setdefault(outer, {})[inner.rstrip("]")] = value
        else:
            params[name] = value
    return params


@dataclass
class StripeEmulator:
    """The ASGI app. All its state is in memory, for one run."""

    lose_answers: int = 0
    processing_seconds: float = 0.0
    outage: bool = False
    charges: list[dict[str, Any]] = field(default_factory=list)
    keys_seen: list[str | None] = field(default_factory=list)
    _saved: dict[str, _Saved] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        extra: list[tuple[bytes, bytes]] = []
        if not headers.get("authorization", "").startswith("Bearer sk_test_"):
            status, answer = _error(401, "invalid_request_error", "Invalid API Key provided")
        elif scope["path"] != PATH:
            status, answer = _error(404, "invalid_request_error", "Unrecognized request URL")
        elif scope["method"] == "GET":
            status, answer = 200, json.dumps({"object": "list", "data": self.charges}).encode()
        elif self.outage:
            self.keys_seen.append(headers.get("idempotency-key"))
            status, answer = _error(503, "api_error", "Stripe is temporarily unavailable")
            extra.append((b"retry-after", b"1"))
        else:
            key = headers.get("idempotency-key")
            self.keys_seen.append(key)
            params = _params(body, headers.get("content-type", ""))
            created = await self._create(key, params, receive)
            if created is None:
                return  # the answer is lost: charged, and nothing is sent back
            status, answer, extra = created
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *extra],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    async def _create(
        self, key: str | None, params: dict[str, Any], receive: Receive
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]] | None:
        saved = self._saved.get(key) if key else None
        if saved is not None:
            if saved.params != params:
                message = (
                    "Keys for idempotent requests can only be used with the same parameters "
                    f"they were first used with. Try using a key other than '{key}'."
                )
                return (*_error(400, "idempotency_error", message), [])
            if not saved.done.is_set():
                message = "There is currently another in-progress request using this key."
                error = _error(409, "invalid_request_error", message, "idempotency_key_in_use")
                return (*error, [])
            return 200, saved.body, [(b"idempotent-replayed", b"true")]
        amount = str(params.get("amount", ""))
        if not amount.isdigit() or int(amount) < 50 or not params.get("currency"):
            # Validation happens before the idempotency layer saves anything.
            message = "amount (an integer, at least 50) and currency are required"
            return (*_error(400, "invalid_request_error", message, "parameter_missing"), [])
        if key:
            saved = self._saved[key] = _Saved(params=params, done=asyncio.Event())
        await asyncio.sleep(self.processing_seconds)
        charge = {
            "id": f"pi_{len(self.charges) + 1:04d}",
            "object": "payment_intent",
            "amount": int(amount),
            "currency": params["currency"],
            "metadata": params.get("metadata", {}),
            "status": "succeeded",
        }
        self.charges.append(charge)
        body = json.dumps(charge).encode()
        if saved is not None:
            saved.body = body
            saved.done.set()
        if self.lose_answers > 0:
            self.lose_answers -= 1
            # Hold the answer until the client gives up and hangs up (bounded).
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(_until_disconnected(receive), timeout=30)
            return None
        return 200, body, []


async def _until_disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@contextmanager
def serve(
    app: ASGIApp,
    sock: socket.socket | None = None,
    *,
    lifespan: Literal["on", "off"] = "off",
) -> Iterator[str]:
    """Run ``app`` in uvicorn on 127.0.0.1, in a background thread; yield its base URL.

    ``sock`` is a socket already bound to a loopback port (default: a free
    one). Until ``serve`` starts listening on it, connections to it are refused.
    """
    if sock is None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    host, port = sock.getsockname()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    thread = threading.Thread(target=server.run, args=([sock],), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"uvicorn did not start on {host}:{port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
