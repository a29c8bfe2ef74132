"""Hooks cannot change what an answer means: an answer that arrived is kept, then the hook raises.

httpx's own idiom (https://www.python-httpx.org/advanced/event-hooks/) is a
response hook that calls ``response.raise_for_status()``. It raises after the
answer arrived: postonce records that answer like any other (a decline ends
the intent ``failed``; a retryable answer is due again), and only then lets
the hook's error reach the caller. End to end on the loopback server; the
Checkout profile matters because Checkout keeps only 2xx answers for a key,
so a re-send after a decline would be executed as a new payment.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from postonce import Outcome, State
from tests.conftest import FAST, ClientFactory, LoopbackServer


def as_hook(kind: str, fn: Any) -> Any:
    """``fn`` as a response hook of the client kind: plain for Client, async for AsyncClient."""
    if kind == "sync":
        return fn

    async def hook(response: httpx.Response) -> None:
        fn(response)

    return hook


def raise_on_4xx_5xx(kind: str) -> Any:
    """httpx's documented hook, as a user writes it (no read: postonce's hook reads first)."""
    return as_hook(kind, lambda response: response.raise_for_status())


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


def test_a_raise_for_status_hook_keeps_a_decline_and_the_drain_never_sends_it_again(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """Under Checkout, a 402 a raise_for_status hook raised on ends failed; it is executed once."""
    client = make_client(
        server.base_url,
        provider="checkout",
        event_hooks={"response": [raise_on_4xx_5xx(client_kind)]},
    )
    body = {"amount": 1, "_test": {"status": 402}}
    with pytest.raises(Exception, match="402") as caught:
        client.post_once("/checkout/payments", json=body, intent="declined")
    # Recorded first, as the decline it is: not an ambiguous attempt...
    assert _ended(client, "declined") == (State.FAILED, 402, [Outcome.FINAL])
    client.drain()
    key = _key(client, "declined")
    assert len(server.requests_for(key)) == 1  # ...so never re-sent
    assert len(server.effects_for(key)) == 1
    # The hook's own error reached the caller, as httpx raises it, the body readable.
    assert type(caught.value).__name__ == "HTTPStatusError"
    assert caught.value.response.json()["status"] == 402  # type: ignore[attr-defined]


def test_a_hook_raising_on_a_success_leaves_the_success_kept(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """A hook that raises on a 201 does not undo it: the same intent again returns the kept 201."""

    def refuse(response: httpx.Response) -> None:
        raise RuntimeError("the application's hook refused the answer")

    client = make_client(server.base_url, event_hooks={"response": [as_hook(client_kind, refuse)]})
    with pytest.raises(RuntimeError, match="refused the answer"):
        client.post_once("/ietf/v1/charges", json={"amount": 2}, intent="charged")
    assert _ended(client, "charged") == (State.SUCCEEDED, 201, [Outcome.FINAL])
    again = client.post_once("/ietf/v1/charges", json={"amount": 2}, intent="charged")
    assert again.status_code == 201
    assert again.extensions["postonce"].from_outbox
    key = _key(client, "charged")
    assert len(server.requests_for(key)) == 1
    assert len(server.effects_for(key)) == 1


def test_a_retryable_answer_a_hook_raised_on_is_due_again_not_ambiguous(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """A 503 a raise_for_status hook raised on is recorded as retryable; the drain finishes it."""
    client = make_client(server.base_url, event_hooks={"response": [raise_on_4xx_5xx(client_kind)]})
    body = {"amount": 3, "_test": {"before": [{"status": 503}]}}
    with pytest.raises(Exception, match="503") as caught:
        client.post_once("/ietf/v1/charges", json=body, intent="busy")
    assert type(caught.value).__name__ == "HTTPStatusError"
    # Not sent again in the foreground (the caller has the hook's error), not ambiguous.
    state, status, outcomes = _ended(client, "busy")
    assert (state, status, outcomes) == (State.PENDING, None, [Outcome.RETRYABLE])
    time.sleep(FAST.wait_max + 0.1)  # past its due time
    client.drain()
    assert _ended(client, "busy") == (
        State.SUCCEEDED,
        201,
        [Outcome.RETRYABLE, Outcome.FINAL],
    )
    assert len(server.effects_for(_key(client, "busy"))) == 1


def test_without_an_answer_a_raising_request_hook_still_leaves_the_intent_ambiguous(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """A request hook raises before any answer: nothing says what happened, so it is ambiguous."""

    def refuse(request: httpx.Request) -> None:
        raise RuntimeError("the application's request hook failed")

    client = make_client(server.base_url, event_hooks={"request": [as_hook(client_kind, refuse)]})
    with pytest.raises(RuntimeError, match="request hook failed"):
        client.post_once("/ietf/v1/charges", json={"amount": 4}, intent="unknown")
    assert _ended(client, "unknown") == (State.PENDING, None, [Outcome.AMBIGUOUS])


def test_a_hook_raising_on_the_answer_after_a_same_origin_redirect_keeps_that_answer(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """With redirects followed, the answer a hook raises on is the hop's, and it is kept."""
    hops = []

    def moved(request: httpx.Request) -> httpx.Response:
        hops.append(request.url.path)
        if request.url.path == "/old/charges":
            return httpx.Response(307, headers={"Location": "/new/charges"})
        return httpx.Response(402, json={"declined": True})

    def raise_on_4xx(response: httpx.Response) -> None:
        if response.status_code >= 400:  # a redirect is not an error here
            response.raise_for_status()

    client = make_client(
        "http://api.test",
        transport=httpx.MockTransport(moved),
        follow_redirects=True,
        event_hooks={"response": [as_hook(client_kind, raise_on_4xx)]},
    )
    with pytest.raises(Exception, match="402"):
        client.post_once("/old/charges", json={"amount": 5}, intent="moved")
    assert hops == ["/old/charges", "/new/charges"]
    assert _ended(client, "moved") == (State.FAILED, 402, [Outcome.FINAL])


def test_the_call_a_hook_raised_in_still_delivers_its_settlement(
    make_client: ClientFactory, client_kind: str, server: LoopbackServer
) -> None:
    """The decline a hook raised on ended the intent: the call itself runs on_settled, once."""
    settled: list[tuple[str, State]] = []
    client = make_client(
        server.base_url,
        provider="checkout",
        event_hooks={"response": [raise_on_4xx_5xx(client_kind)]},
        on_settled=lambda s: settled.append((s.intent, s.state)),
    )
    body = {"amount": 1, "_test": {"status": 402}}
    with pytest.raises(Exception, match="402"):
        client.post_once("/checkout/payments", json=body, intent="declined-settled")
    assert settled == [("declined-settled", State.FAILED)]  # before the call returned
    client.drain()
    assert settled == [("declined-settled", State.FAILED)]
