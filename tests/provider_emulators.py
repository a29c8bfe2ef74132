"""Small emulators of each provider family's documented answers, for end-to-end tests.

Each is an ASGI app served by uvicorn on 127.0.0.1 (conftest's ``_serve``). A
request names its key in the profile's header (or, with ``key_field`` set, in
that top-level JSON body field, as AWS's ClientToken travels) and its script in
the JSON body (``"fail": n`` — the first n requests with that key fail the
documented way). The app keeps a ledger of requests and effects per key, read
directly by tests.

Families (the facts are in ``postonce.providers`` with their sources):

* ``replayed`` (Stripe v1): the failing execution is stored and its 500 replayed
  with ``Idempotent-Replayed: true``; ``"slow_first": s`` answers the first
  request only after ``s`` seconds (a client timeout: an ambiguous attempt);
  ``"should_retry": false`` adds
  ``Stripe-Should-Retry: false`` to the 500. ``"conflict": n``: the first n
  requests find the key held by another request still running and get
  ``409 idempotency_key_in_use`` (with ``Stripe-Should-Retry: false`` if
  ``"should_retry": false``); nothing executes.
* ``retry`` (AWS, PayPal): the 500 comes before anything executes; the same key
  later executes once. ``"throttle": n``: the first n requests are refused
  before anything executes with EC2's throttling answer, a 400 whose XML error
  code is ``RequestLimitExceeded``.
* ``ietf`` (draft-ietf-httpapi-idempotency-key-header): the key's first request
  executes and is stored; the same key with the same body replays it, with
  another body gets ``422`` and ``Link: <...>; rel="describedby"`` (the draft's
  header form of the error, no body).
* ``not_stored`` (Checkout.com, Modern Treasury): the execution fails with 500 and
  nothing is stored; the same key is executed again.
* ``hint`` (Adyen): a 500 without ``transient-error`` (do not retry);
  ``"transient": true`` adds ``transient-error: true`` (retry with the same key).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Emulator:
    """One family's behaviour; ``requests`` and ``effects`` count per key."""

    family: str
    key_header: bytes = b"idempotency-key"
    key_field: str | None = None
    requests: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    stored: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    bodies: dict[str, bytes] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        script = json.loads(body or b"{}")
        if self.key_field is not None:
            key = str(script.get(self.key_field, ""))
        else:
            key = dict(scope["headers"]).get(self.key_header, b"").decode()
        n = self.requests[key] = self.requests.get(key, 0) + 1
        if self.family == "ietf":
            status, headers, answer = self._ietf(key, body)
        else:
            status, headers, answer = self._answer(key, n, script)
        if n == 1 and script.get("slow_first"):
            # The first answer comes too late for the client: an ambiguous attempt.
            await asyncio.sleep(float(script["slow_first"]))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _execute(self, key: str) -> bytes:
        self.effects[key] = self.effects.get(key, 0) + 1
        return json.dumps({"id": f"ch_{key[:8]}", "key": key}).encode()

    def _answer(self, key: str, n: int, script: dict[str, Any]) -> tuple[int, list[Any], bytes]:
        json_type = [(b"content-type", b"application/json")]
        failing = n <= int(script.get("fail", 0))
        no_retry = (
            [(b"stripe-should-retry", b"false")] if script.get("should_retry") is False else []
        )
        if self.family == "replayed" and n <= int(script.get("conflict", 0)):
            # Another request holds the key: Stripe answers before executing, stores nothing.
            answer = b'{"error":{"code":"idempotency_key_in_use"}}'
            return 409, [*json_type, *no_retry], answer
        if self.family == "retry" and n <= int(script.get("throttle", 0)):
            xml = (
                b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
                b"<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message>"
                b"</Error></Errors><RequestID>r-1</RequestID></Response>"
            )
            return 400, [(b"content-type", b"text/xml;charset=UTF-8")], xml
        if key in self.stored:
            status, answer = self.stored[key]
            hint = no_retry if status >= 500 else []
            return status, [*json_type, (b"idempotent-replayed", b"true"), *hint], answer
        if self.family == "replayed" and failing:
            self._execute(key)  # execution began, then failed: the 500 is the stored answer
            self.stored[key] = (500, b'{"error":{"type":"api_error"}}')
            return 500, [*json_type, *no_retry], self.stored[key][1]
        if self.family == "retry" and failing:
            return 500, json_type, b'{"error":"InternalError"}'  # nothing executed
        if self.family == "not_stored" and failing:
            self._execute(key)  # attempted and failed; nothing stored behind the key
            self.effects[key] -= 1  # a failed payment attempt leaves no charge
            return 500, json_type, b'{"error":"processing_error"}'
        if self.family == "hint" and failing:
            extra = [(b"transient-error", b"true")] if script.get("transient") else []
            return 500, [*json_type, *extra], b'{"errorCode":"901"}'
        answer = self._execute(key)
        self.stored[key] = (201, answer)  # every family stores a success
        return 201, json_type, answer

    def _ietf(self, key: str, body: bytes) -> tuple[int, list[Any], bytes]:
        if key in self.bodies and self.bodies[key] != body:
            link = (
                b'<https://developer.example.com/idempotency>; rel="describedby"; type="text/html"'
            )
            return 422, [(b"link", link)], b""
        if key in self.stored:
            status, answer = self.stored[key]
            replayed = [(b"content-type", b"application/json"), (b"idempotent-replayed", b"true")]
            return status, replayed, answer
        self.bodies[key] = body
        answer = self._execute(key)
        self.stored[key] = (201, answer)
        return 201, [(b"content-type", b"application/json")], answer
