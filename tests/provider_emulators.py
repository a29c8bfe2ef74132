"""Small emulators of each provider family's documented answers to a 5xx, for end-to-end tests.

Each is an ASGI app served by uvicorn on 127.0.0.1 (conftest's ``_serve``). A
request names its key in the profile's header and its script in the JSON body
(``"fail": n`` — the first n requests with that key fail the documented way).
The app keeps a ledger of requests and effects per key, read directly by tests.

Families (the facts are in ``postonce.providers`` with their sources):

* ``replayed`` (Stripe v1): the failing execution is stored and its 500 replayed
  with ``Idempotent-Replayed: true``; ``"should_retry": false`` adds
  ``Stripe-Should-Retry: false`` to the 500.
* ``retry`` (AWS, PayPal): the 500 comes before anything executes; the same key
  later executes once.
* ``not_stored`` (Checkout.com, Modern Treasury): the execution fails with 500 and
  nothing is stored; the same key is executed again.
* ``hint`` (Adyen): a 500 without ``transient-error`` (do not retry);
  ``"transient": true`` adds ``transient-error: true`` (retry with the same key).
"""

from __future__ import annotations

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
    requests: dict[str, int] = field(default_factory=dict)
    effects: dict[str, int] = field(default_factory=dict)
    stored: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        key = dict(scope["headers"]).get(self.key_header, b"").decode()
        script = json.loads(body or b"{}")
        n = self.requests[key] = self.requests.get(key, 0) + 1
        status, headers, answer = self._answer(key, n, script)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def _execute(self, key: str) -> bytes:
        self.effects[key] = self.effects.get(key, 0) + 1
        return json.dumps({"id": f"ch_{key[:8]}", "key": key}).encode()

    def _answer(self, key: str, n: int, script: dict[str, Any]) -> tuple[int, list[Any], bytes]:
        json_type = [(b"content-type", b"application/json")]
        failing = n <= int(script.get("fail", 0))
        if key in self.stored:
            status, answer = self.stored[key]
            return status, [*json_type, (b"idempotent-replayed", b"true")], answer
        if self.family == "replayed" and failing:
            self._execute(key)  # execution began, then failed: the 500 is the stored answer
            self.stored[key] = (500, b'{"error":{"type":"api_error"}}')
            extra = (
                [(b"stripe-should-retry", b"false")] if script.get("should_retry") is False else []
            )
            return 500, [*json_type, *extra], self.stored[key][1]
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
