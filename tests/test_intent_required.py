"""A call names its intent: without intent= (or a key of the caller's), nothing is stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import postonce
from tests.conftest import ClientFactory

METHODS = ["post_once", "put_once", "patch_once", "delete_once", "request_once"]


class Recorder:
    """A transport that answers 201 and keeps what reached it."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []
        self.transport = httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return httpx.Response(201)


def _call(client: Any, method: str, **options: Any) -> httpx.Response:
    if method == "request_once":
        return client.request_once("POST", "/c", json={"a": 1}, **options)  # type: ignore[no-any-return]
    return getattr(client, method)("/c", json={"a": 1}, **options)  # type: ignore[no-any-return]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "options",
    [pytest.param({}, id="no-intent"), pytest.param({"intent": None}, id="intent-none")],
)
def test_a_call_that_names_no_intent_is_refused_before_anything_is_stored(
    make_client: ClientFactory, method: str, options: dict[str, Any]
) -> None:
    """Every *_once method, on both clients, refuses a call with no intent name: nothing stored."""
    rec = Recorder()
    client = make_client(transport=rec.transport)
    with pytest.raises(postonce.InvalidRequest) as raised:
        _call(client, method, **options)
    assert "names no intent" in str(raised.value)
    assert "postonce.ONE_OFF" in str(raised.value)
    assert rec.sent == []
    assert client.outbox.stats(now=0.0)["states"] == {s.value: 0 for s in postonce.State}


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"intent": postonce.ONE_OFF}, id="one-off"),
        pytest.param({"key": "order-7-charge-key"}, id="key-of-the-callers"),
        pytest.param({"headers": {"Idempotency-Key": "order-8-charge-key"}}, id="key-header"),
        pytest.param({"intent": "order-9/charge"}, id="named"),
    ],
)
def test_a_call_that_names_its_intent_is_sent(
    make_client: ClientFactory, options: dict[str, Any]
) -> None:
    """intent=, a key of the caller's (argument or header), or ONE_OFF: the call goes through."""
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(201)))
    assert client.post_once("/c", json={"a": 1}, **options).status_code == 201


def test_one_off_calls_are_each_their_own_intent(make_client: ClientFactory) -> None:
    """Two ONE_OFF calls are two intents with two keys: nothing ties them together."""
    rec = Recorder()
    client = make_client(transport=rec.transport)
    first = client.post_once("/c", json={"a": 1}, intent=postonce.ONE_OFF)
    second = client.post_once("/c", json={"a": 1}, intent=postonce.ONE_OFF)
    assert first.extensions["postonce"].key != second.extensions["postonce"].key
    assert len(rec.sent) == 2


def test_one_off_reads_as_its_name() -> None:
    """The sentinel says what it is in a traceback or a log line."""
    assert repr(postonce.ONE_OFF) == "postonce.ONE_OFF"
