"""A small ASGI payments API that honours idempotency keys the way providers document.

Served by uvicorn on 127.0.0.1 in the tests. The first path segment picks the
profile it imitates (``/ietf/...``, ``/stripe/...``, ``/square/...``,
``/checkout/...``), which decides where the key travels, the answers for a
key in flight and for a reused key, the replay marker, and whether 5xx
answers are stored and replayed.

Per key, it stores the first request's fingerprint and its answer; a retry
with the same key gets the stored answer marked as a replay; a retry while
the first is still processing gets the in-flight answer; a retry with a
changed body gets the mismatch answer. Every executed side effect is appended
to the ledger, which ``GET /_ledger`` returns, so tests prove "exactly once"
from the server's side.

The request body may carry test directives under ``"_test"`` (part of the
body, so every retry carries them too):

* ``delay``: seconds the first execution takes (a slow gateway);
* ``status``: the status the execution answers with (402, 500, ...);
* ``drop_first``: the first execution is stored, then its connection is cut
  mid-answer (the client sees a protocol error, as when a response is lost);
* ``rate_limit``: ``{"window": NAME, "retry_after": SECONDS}``: a rate limiter
  in front of the API; the first request naming the window opens it, and every
  request while it is open gets 429 with ``Retry-After`` (nothing executed);
* ``api_key``: the ``X-API-Key`` the request must carry (a merchant's own key,
  passed per call by a platform); any other is answered 401 before the
  idempotency layer, so nothing is executed or stored;
* ``before``: a list of answers given *before* the idempotency layer to the
  first requests with this key, e.g. ``[{"status": 503, "retry_after": "1"}]``
  (a load balancer or rate limiter: nothing is executed or stored); an entry's
  ``delay`` holds that answer back for as many seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
SendFn = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class Profile:
    key_header: str | None = "idempotency-key"
    key_body_field: str | None = None
    in_flight_status: int = 409
    mismatch_status: int = 422
    mismatch_body: dict[str, Any] = field(default_factory=lambda: {"type": "key_reused"})
    replay_header: str | None = "idempotent-replayed"
    replays_5xx: bool = True
    # False: a reuse of a completed key is answered 409 forever, never replayed (a
    # provider that only says "already done"): a lost record can never be repaired.
    replays_completed: bool = True


PROFILES = {
    "ietf": Profile(),
    "stripe": Profile(mismatch_status=400, mismatch_body={"error": {"type": "idempotency_error"}}),
    "noreplay": Profile(replays_completed=False),
    "checkout": Profile(key_header="cko-idempotency-key", replay_header=None, replays_5xx=False),
    "square": Profile(
        key_header=None,
        key_body_field="idempotency_key",
        mismatch_status=400,
        mismatch_body={"errors": [{"code": "IDEMPOTENCY_KEY_REUSED"}]},
        replay_header=None,
    ),
}


@dataclass
class Entry:
    fingerprint: str
    done: asyncio.Event
    status: int = 0
    body: bytes = b""


@dataclass
class State:
    entries: dict[str, Entry] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    max_active: dict[str, int] = field(default_factory=dict)
    open_requests: dict[str, int] = field(default_factory=dict)
    max_concurrent: dict[str, int] = field(default_factory=dict)
    open_now: int = 0  # requests open at once, all keys together
    most_open: int = 0
    limited_until: dict[str, float] = field(default_factory=dict)  # rate-limit window ends


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


async def _read_body(receive: Receive) -> bytes:
    """The whole request body; a request cut off mid-body is never processed."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(
    send: SendFn, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": body})


class IdempotentApp:
    """The ASGI app. One instance per server; ``state`` is its whole memory."""

    def __init__(self) -> None:
        self.state = State()

    async def __call__(self, scope: Scope, receive: Receive, send: SendFn) -> None:
        if scope["type"] != "http":
            return
        try:
            body = await _read_body(receive)
        except ClientGone:
            return  # like any real server: half a request is no request
        path: str = scope["path"]
        if path == "/_ledger":
            s = self.state
            out = {
                "effects": s.effects,
                "requests": s.requests,
                "max_active": s.max_active,
                "max_concurrent": s.max_concurrent,
                "most_open": s.most_open,
            }
            await _answer(send, 200, json.dumps(out).encode())
            return
        if path == "/_reset":
            self.state = State()
            await _answer(send, 204, b"")
            return
        profile_name = path.strip("/").split("/", 1)[0]
        profile = PROFILES.get(profile_name)
        if profile is None:
            await _answer(send, 404, b'{"error":"unknown profile"}')
            return
        await self._idempotent(scope, body, profile, send)

    async def _idempotent(self, scope: Scope, raw: bytes, profile: Profile, send: SendFn) -> None:
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        try:
            parsed: Any = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"_raw": raw.decode("utf-8", "replace")}
        directives = parsed.pop("_test", {}) if isinstance(parsed, dict) else {}
        if profile.key_header is not None:
            key = headers.get(profile.key_header)
        else:
            assert profile.key_body_field is not None
            key = parsed.pop(profile.key_body_field, None) if isinstance(parsed, dict) else None
        s = self.state
        s.requests.append(
            {
                "key": key,
                "method": scope["method"],
                "path": scope["path"],
                "worker": headers.get("x-worker"),
                "api_key": headers.get("x-api-key"),
                # Who sent it, and with which query: the sender-identity tests read these.
                "authorization": headers.get("authorization"),
                "query": scope["query_string"].decode(),
                "at": time.monotonic(),  # the tests run in this process: the same clock
            }
        )
        if not key:
            await _answer(send, 400, b'{"error":"missing idempotency key"}')
            return
        wanted = directives.get("api_key")
        if wanted is not None and headers.get("x-api-key") != wanted:
            # Authentication comes before the idempotency layer, as at every provider.
            await _answer(send, 401, b'{"error":{"type":"authentication_error"}}')
            return
        # Every request with this key that is open at once, replays and 409s included.
        s.open_requests[key] = s.open_requests.get(key, 0) + 1
        s.max_concurrent[key] = max(s.max_concurrent.get(key, 0), s.open_requests[key])
        s.open_now += 1
        s.most_open = max(s.most_open, s.open_now)
        try:
            await self._keyed(s, key, scope, parsed, directives, profile, send)
        finally:
            s.open_requests[key] -= 1
            s.open_now -= 1

    @staticmethod
    async def _rate_limited(s: State, limit: dict[str, Any], send: SendFn) -> bool:
        """A recovering provider's rate limiter, before the idempotency layer: the first
        request of ``limit["window"]`` opens it, and every request while it is open is
        answered 429 with the seconds left as Retry-After. Nothing is executed."""
        now = time.monotonic()
        window = str(limit["window"])
        if window not in s.limited_until:
            s.limited_until[window] = now + float(limit["retry_after"])
        left = s.limited_until[window] - now
        if left <= 0:
            return False
        seconds = str(max(1, math.ceil(left))).encode()
        await _answer(send, 429, b'{"error":"rate_limited"}', [(b"retry-after", seconds)])
        return True

    async def _keyed(
        self,
        s: State,
        key: str,
        scope: Scope,
        parsed: Any,
        directives: dict[str, Any],
        profile: Profile,
        send: SendFn,
    ) -> None:
        limit = directives.get("rate_limit")
        if limit is not None and await self._rate_limited(s, limit, send):
            return
        n = s.seen.get(key, 0)
        s.seen[key] = n + 1
        before = directives.get("before", [])
        if n < len(before):
            b = before[n]
            extra = []
            if "retry_after" in b:
                extra.append((b"retry-after", str(b["retry_after"]).encode()))
            await asyncio.sleep(float(b.get("delay", 0)))
            await _answer(send, int(b["status"]), b'{"error":"try again"}', extra)
            return
        fingerprint = hashlib.sha256(
            scope["method"].encode()
            + scope["path"].encode()
            + json.dumps(parsed, sort_keys=True).encode()
        ).hexdigest()
        entry = s.entries.get(key)
        if entry is not None:
            if entry.fingerprint != fingerprint:
                await _answer(
                    send, profile.mismatch_status, json.dumps(profile.mismatch_body).encode()
                )
            elif not entry.done.is_set() or not profile.replays_completed:
                await _answer(send, profile.in_flight_status, b'{"error":"in flight"}')
            else:
                replay = (
                    [(profile.replay_header.encode(), b"true")] if profile.replay_header else []
                )
                await _answer(send, entry.status, entry.body, replay)
            return
        entry = Entry(fingerprint=fingerprint, done=asyncio.Event())
        s.entries[key] = entry
        s.active[key] = s.active.get(key, 0) + 1
        s.max_active[key] = max(s.max_active.get(key, 0), s.active[key])
        try:
            await asyncio.sleep(float(directives.get("delay", 0)))
            status = int(directives.get("status", 201))
            effect_id = f"ch_{len(s.effects) + 1}"
            s.effects.append({"id": effect_id, "key": key, "path": scope["path"], "body": parsed})
            answer = json.dumps({"id": effect_id, "status": status, "key": key, **parsed}).encode()
        finally:
            s.active[key] -= 1
        if status >= 500 and not profile.replays_5xx:
            del s.entries[key]  # nothing saved: a retry executes again
        else:
            entry.status, entry.body = status, answer
            entry.done.set()
        if directives.get("drop_first"):
            # Executed and stored, then the connection dies mid-answer: the
            # client cannot tell this from a request that never arrived.
            await send({"type": "http.response.start", "status": status, "headers": []})
            raise ConnectionAbortedError("test server dropped the answer on purpose")
        await _answer(send, status, answer)
