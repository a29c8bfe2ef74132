"""Per-call credentials are honoured or refused, never replaced by a 401.

A platform sends each merchant's charge with that merchant's key
(``headers={"X-API-Key": ...}`` on the call). The outbox keeps only the
header's name (``IntentRecord.needs``). End to end on the loopback server,
which answers 401 before its idempotency layer to a request without the
merchant's key (``_test.api_key``), as providers do: the first send is
executed and its answer lost (``drop_first``), so the intent is pending when
the drain finds it. Before this change the drain re-sent it with no key, and
the 401 was stored as the intent's final answer although the charge was made.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

import postonce
from postonce import IntentRecord, State
from tests.conftest import FAST, ClientFactory, LoopbackServer

ONE_TRY = FAST.model_copy(update={"attempts": 1})
MERCHANT_KEY = "merchant_A_key"


def charge_left_pending(client: Any, reference: str) -> str:
    """Charge with the merchant's own key; the answer is lost, the intent left pending: its key."""
    body = {"amount": 1, "_test": {"api_key": MERCHANT_KEY, "drop_first": True}}
    with pytest.raises(postonce.IntentPending) as info:
        client.post_once(
            "/ietf/charges",
            json=body,
            intent=reference,
            headers={"X-API-Key": MERCHANT_KEY},
            retry=ONE_TRY,
        )
    record = client.lookup(reference)
    assert record is not None
    assert record.needs == ("x-api-key",)
    assert record.due_at is not None
    time.sleep(max(0.0, record.due_at - time.time()))
    return str(info.value.key)


def sent_keys(server: LoopbackServer, key: str) -> list[str | None]:
    return [request["api_key"] for request in server.requests_for(key)]


def test_a_drain_without_the_calls_credentials_leaves_the_intent_pending(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """No credentials_for=: handed back pending, counted unsendable, not sent without the key."""
    platform = make_client(server.base_url)
    key = charge_left_pending(platform, "order-1/charge")
    report = platform.drain()
    assert (report.claimed, report.unsendable, report.failed) == (1, 1, 0)
    assert not report.ok
    record = platform.lookup("order-1/charge")
    assert record is not None
    assert record.state is State.PENDING  # never "failed" by a 401
    assert record.due_at is not None
    assert record.due_at > time.time() + 30  # handed back due later: a one-shot drain ends
    assert sent_keys(server, key) == [MERCHANT_KEY]  # nothing sent without it
    assert len(server.effects_for(key)) == 1


def test_a_drain_with_credentials_for_sends_with_the_merchants_key(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """credentials_for= supplies the key by the intent's meta: the stored answer comes back."""
    asked: list[tuple[str, tuple[str, ...], Any]] = []

    def credentials_for(record: IntentRecord) -> Mapping[str, str] | None:
        asked.append((record.reference, record.needs, record.meta))
        return {"X-API-Key": MERCHANT_KEY} if record.meta == {"merchant": "A"} else None

    platform = make_client(server.base_url, credentials_for=credentials_for)
    body = {"amount": 1, "_test": {"api_key": MERCHANT_KEY, "drop_first": True}}
    with pytest.raises(postonce.IntentPending) as info:
        platform.post_once(
            "/ietf/charges",
            json=body,
            intent="order-2/charge",
            headers={"X-API-Key": MERCHANT_KEY},
            meta={"merchant": "A"},
            retry=ONE_TRY,
        )
    key = str(info.value.key)
    record = platform.lookup("order-2/charge")
    assert record is not None
    assert record.due_at is not None
    time.sleep(max(0.0, record.due_at - time.time()))
    report = platform.drain()
    assert (report.succeeded, report.unsendable) == (1, 0)
    assert asked == [("order-2/charge", ("x-api-key",), {"merchant": "A"})]
    assert sent_keys(server, key) == [MERCHANT_KEY, MERCHANT_KEY]
    assert len(server.effects_for(key)) == 1  # the second send got the stored answer


@pytest.mark.parametrize(
    ("supplies", "why"),
    [
        pytest.param(lambda record: None, "supplied none", id="none"),
        pytest.param(lambda record: {"Authorization": "x"}, "x-api-key", id="not-the-needed"),
        pytest.param(lambda record: {"x-api-key": 1}, "no string value", id="not-a-string"),
        pytest.param(lambda record: 1 / 0, "ZeroDivisionError", id="raises"),
    ],
)
def test_credentials_not_supplied_leave_the_intent_pending_and_say_why(
    make_client: ClientFactory,
    server: LoopbackServer,
    supplies: Any,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A callback that cannot supply the key: unsendable, logged with the reason, nothing sent."""
    platform = make_client(server.base_url, credentials_for=supplies)
    key = charge_left_pending(platform, "order-3/charge")
    with caplog.at_level("WARNING", logger="postonce"):
        report = platform.drain()
    assert report.unsendable == 1
    assert why in caplog.text
    assert MERCHANT_KEY not in caplog.text
    assert sent_keys(server, key) == [MERCHANT_KEY]
    record = platform.lookup("order-3/charge")
    assert record is not None
    assert record.state is State.PENDING


def test_a_401_to_wrong_supplied_credentials_is_never_the_intents_answer(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """A rotated or wrong key supplied later: the 401 says nothing of the executed first send."""
    platform = make_client(server.base_url, credentials_for=lambda r: {"x-api-key": "stale"})
    key = charge_left_pending(platform, "order-4/charge")
    report = platform.drain()
    assert (report.failed, report.succeeded, report.pending) == (0, 0, 1)
    record = platform.lookup("order-4/charge")
    assert record is not None
    assert record.state is State.PENDING
    assert record.response is None
    assert sent_keys(server, key) == [MERCHANT_KEY, "stale"]
    assert len(server.effects_for(key)) == 1


def test_a_first_send_refused_for_its_credentials_is_the_answer(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """To a fresh key nothing was executed: a 401 is returned and stored as the answer it is."""
    client = make_client(server.base_url)
    response = client.post_once(
        "/ietf/charges",
        json={"amount": 1, "_test": {"api_key": MERCHANT_KEY}},
        intent="order-5/charge",
        headers={"X-API-Key": "wrong"},
    )
    assert response.status_code == 401
    record = client.lookup("order-5/charge")
    assert record is not None
    assert record.state is State.FAILED


def test_an_async_credentials_for_is_awaited(
    make_async_client: ClientFactory, server: LoopbackServer
) -> None:
    """On AsyncClient, credentials_for may be a coroutine function: awaited, then used."""

    async def credentials_for(record: IntentRecord) -> Mapping[str, str]:
        return {"X-API-Key": MERCHANT_KEY}

    platform = make_async_client(server.base_url, credentials_for=credentials_for)
    key = charge_left_pending(platform, "order-6/charge")
    assert platform.drain().succeeded == 1
    assert sent_keys(server, key) == [MERCHANT_KEY, MERCHANT_KEY]


def test_client_refuses_a_coroutine_credentials_for(make_sync_client: ClientFactory) -> None:
    """Client calls credentials_for without awaiting: a coroutine function is refused at once."""

    async def credentials_for(record: IntentRecord) -> Mapping[str, str]:
        return {}

    with pytest.raises(postonce.ConfigurationError, match="credentials_for= is a coroutine"):
        make_sync_client(credentials_for=credentials_for)
