"""Redirects stay home: a redirect to another origin never takes an intent's body, key or secrets.

End to end on two loopback origins: "home", the idempotent test API behind a
front that redirects some paths, and "elsewhere", which records every byte it
is sent. Every client is built to follow redirects (``follow_redirects=True``);
postonce follows only those that stay on the origin the request went to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from postonce import IntentPending, Outcome, State
from postonce._sender import origin_of
from tests.conftest import FAST, ClientFactory, LoopbackServer, _serve
from tests.idem_server import IdempotentApp, Receive, Scope, SendFn

#: An Adyen API key: a secret header (the adyen profile's credential header).
API_KEY = "AQEyhmfxADYENSECRET"


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body") or message["type"] == "http.disconnect":
            return b"".join(chunks)


async def _respond(send: SendFn, status: int, body: bytes, *headers: tuple[bytes, bytes]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Elsewhere:
    """Another origin: keeps every request it gets, whole, and says 201 to each."""

    received: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: SendFn) -> None:
        if scope["type"] != "http":
            return
        body = await _body(receive)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"]]
        self.received.append({"path": scope["path"], "headers": headers, "body": body})
        await _respond(send, 201, b'{"id":"elsewhere"}', (b"content-type", b"application/json"))


@dataclass
class Home:
    """The idempotent test API behind a front that redirects some paths (a moved endpoint).

    ``/away/<path>``: a 307 to ``<elsewhere>/<path>``; ``/here/<path>``: a 307 to
    ``/<path>`` on this origin; ``/loop/<path>``: a 307 to itself; ``/later/<path>``:
    a 503 (nothing done) to a key's first request, then as ``away``. It keeps the
    key of every request its front answers.
    """

    inner: IdempotentApp
    elsewhere: str = ""
    redirected: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: SendFn) -> None:
        kind, _, rest = str(scope.get("path", "")).lstrip("/").partition("/")
        if scope["type"] != "http" or kind not in ("away", "here", "loop", "later"):
            await self.inner(scope, receive, send)
            return
        await _body(receive)
        headers: MutableMapping[str, str] = {
            k.decode().lower(): v.decode() for k, v in scope["headers"]
        }
        key = headers.get("idempotency-key")
        seen = [r["key"] for r in self.redirected].count(key)
        self.redirected.append({"path": scope["path"], "key": key})
        if kind == "later" and not seen:
            await _respond(send, 503, b"")
            return
        location = {
            "away": f"{self.elsewhere}/{rest}",
            "later": f"{self.elsewhere}/{rest}",
            "here": f"/{rest}",
            "loop": scope["path"],
        }[kind]
        await _respond(send, 307, b"", (b"location", location.encode()))


@dataclass
class Origins:
    home: LoopbackServer
    home_app: Home
    elsewhere: str
    elsewhere_app: Elsewhere


@pytest.fixture(scope="module")
def origins() -> Iterator[Origins]:
    """Two loopback origins (two ports of 127.0.0.1): home redirects, elsewhere records."""
    catcher = Elsewhere()
    uv_there, thread_there, port_there = _serve(catcher)  # type: ignore[arg-type]
    elsewhere = f"http://127.0.0.1:{port_there}"
    home_app = Home(IdempotentApp(), elsewhere)
    uv_home, thread_home, port_home = _serve(home_app)  # type: ignore[arg-type]
    home = LoopbackServer(app=home_app.inner, base_url=f"http://127.0.0.1:{port_home}")
    yield Origins(home, home_app, elsewhere, catcher)
    for uv, thread in ((uv_home, thread_home), (uv_there, thread_there)):
        uv.should_exit = True
        thread.join(timeout=10)


def _following(make_client: ClientFactory, origins: Origins, **kwargs: Any) -> Any:
    """An Adyen-style client of home with its API key, built to follow redirects."""
    return make_client(
        origins.home.base_url,
        provider="adyen",
        headers={"X-API-Key": API_KEY},
        follow_redirects=True,
        **kwargs,
    )


def _ended(client: Any, intent: str) -> tuple[State, int | None, list[Outcome]]:
    """How ``intent`` stands: its state, the status of its stored answer, its attempts' outcomes."""
    record = client.lookup(intent)
    assert record is not None
    status = record.response.status if record.response is not None else None
    return record.state, status, [a.outcome for a in client.outbox.attempts(intent)]


def _key(client: Any, intent: str) -> str:
    record = client.lookup(intent)
    assert record is not None
    return str(record.key)


def _home_origin(origins: Origins) -> str:
    found = origin_of(origins.home.base_url)
    assert found is not None
    return found


def test_a_redirect_to_another_origin_is_the_answer_and_nothing_goes_there(
    make_client: ClientFactory, origins: Origins, caplog: pytest.LogCaptureFixture
) -> None:
    """A 307 to another origin is not followed: it is the intent's answer, and a WARNING says so."""
    client = _following(make_client, origins)
    before = len(origins.elsewhere_app.received)
    with caplog.at_level(logging.WARNING, logger="postonce"):
        response = client.post_once(
            "/away/ietf/v1/charges", json={"amount": 1}, intent="moved-away"
        )
    # Elsewhere got nothing: no body, no key, no API key.
    assert origins.elsewhere_app.received[before:] == []
    assert response.status_code == 307
    assert _ended(client, "moved-away") == (State.FAILED, 307, [Outcome.FINAL])
    client.drain()  # nothing to send: the 307 ended the intent
    assert origins.elsewhere_app.received[before:] == []
    assert [r["key"] for r in origins.home_app.redirected].count(_key(client, "moved-away")) == 1
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(_home_origin(origins) in m and origins.elsewhere in m for m in warned), warned


def test_the_drain_never_follows_a_redirect_to_another_origin(
    make_client: ClientFactory, origins: Origins
) -> None:
    """A drain's send is a send: a 307 to another origin is its answer, nothing leaves home."""
    client = _following(make_client, origins, retry=FAST.model_copy(update={"attempts": 1}))
    before = len(origins.elsewhere_app.received)
    # The first send gets a 503 (nothing done): the intent is left to the drain.
    with pytest.raises(IntentPending):
        client.post_once("/later/ietf/v1/charges", json={"amount": 2}, intent="drained-away")
    time.sleep(0.2)  # past its due time
    client.drain()
    assert _ended(client, "drained-away") == (
        State.FAILED,
        307,
        [Outcome.RETRYABLE, Outcome.FINAL],
    )
    assert [r["key"] for r in origins.home_app.redirected].count(_key(client, "drained-away")) == 2
    assert origins.elsewhere_app.received[before:] == []


def test_a_same_origin_redirect_is_followed_and_its_answer_is_the_intents(
    make_client: ClientFactory, origins: Origins
) -> None:
    """A 307 to a path of the same origin is followed, same key; its answer ends the intent."""
    client = _following(make_client, origins)
    response = client.post_once("/here/ietf/v1/charges", json={"amount": 3}, intent="moved-here")
    assert response.status_code == 201
    assert [hop.status_code for hop in response.history] == [307]
    assert _ended(client, "moved-here") == (State.SUCCEEDED, 201, [Outcome.FINAL])
    key = _key(client, "moved-here")
    assert len(origins.home.effects_for(key)) == 1
    (arrived,) = origins.home.requests_for(key)
    assert arrived["path"] == "/ietf/v1/charges"


def test_without_follow_redirects_a_redirect_is_the_answer_as_in_httpx(
    make_client: ClientFactory, origins: Origins, caplog: pytest.LogCaptureFixture
) -> None:
    """A client not built to follow redirects returns the 307 as httpx does, without a warning."""
    client = make_client(origins.home.base_url, provider="adyen", headers={"X-API-Key": API_KEY})
    with caplog.at_level(logging.WARNING, logger="postonce"):
        response = client.post_once("/here/ietf/v1/charges", json={"amount": 4}, intent="kept")
    assert response.status_code == 307
    assert _ended(client, "kept") == (State.FAILED, 307, [Outcome.FINAL])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_redirect_loop_stops_at_max_redirects_and_its_last_answer_is_kept(
    make_client: ClientFactory, origins: Origins
) -> None:
    """Past httpx's max_redirects the caller gets TooManyRedirects; the last 307 is kept first."""
    client = _following(make_client, origins, max_redirects=2)
    with pytest.raises(Exception, match="Exceeded maximum allowed redirects") as caught:
        client.post_once("/loop/ietf/v1/charges", json={"amount": 5}, intent="loop")
    assert type(caught.value).__name__ == "TooManyRedirects"
    assert _ended(client, "loop") == (State.FAILED, 307, [Outcome.FINAL])
    # The first send and two hops: max_redirects=2, as httpx counts them.
    assert [r["key"] for r in origins.home_app.redirected].count(_key(client, "loop")) == 3
