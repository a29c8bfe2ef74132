"""End to end against a real uvicorn server on 127.0.0.1 that honours keys."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

import postonce
from postonce import State
from tests.conftest import FAST, ClientFactory, LoopbackServer


def test_field_scenario_timeout_then_one_charge(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Client timeout 1 s, server takes 2 s: the retry gets the original answer, one charge."""
    client = make_client(server.base_url, timeout=httpx.Timeout(5.0, read=1.0))
    response = client.post_once(
        "/ietf/v1/charges",
        json={"amount": 4200, "currency": "usd", "_test": {"delay": 2.0}},
        intent="order-1234/charge",
    )
    info = response.extensions["postonce"]
    effects = server.effects_for(info.key)
    assert len(effects) == 1
    assert response.status_code == 201
    assert response.json()["id"] == effects[0]["id"]
    assert info.replayed is True
    attempts = client.outbox.attempts("order-1234/charge")
    assert attempts[0].outcome is postonce.Outcome.AMBIGUOUS
    assert attempts[0].error_type == "ReadTimeout"
    assert attempts[-1].outcome is postonce.Outcome.FINAL
    assert len(attempts) >= 2


def test_gateway_503_with_retry_after_then_success(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """503s before the idempotency layer are retried after Retry-After; one charge."""
    client = make_client(server.base_url)
    response = client.post_once(
        "/ietf/v1/charges",
        json={"amount": 1, "_test": {"before": [{"status": 503, "retry_after": "0"}] * 2}},
        intent="gw-503",
    )
    assert response.status_code == 201
    key = response.extensions["postonce"].key
    assert len(server.requests_for(key)) == 3
    assert len(server.effects_for(key)) == 1


def test_stored_500_is_indeterminate_once_replayed(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Stripe: a bare 500 is retried with the same key; the replayed 500 ends it indeterminate."""
    client = make_client(server.base_url, provider="stripe")
    with pytest.raises(postonce.IntentIndeterminate) as raised:
        client.post_once(
            "/stripe/v1/charges", json={"amount": 1, "_test": {"status": 500}}, intent="s-500"
        )
    response = raised.value.response
    assert response is not None
    assert response.status_code == 500
    assert response.extensions["postonce"].replayed is True
    key = raised.value.key
    assert len(server.requests_for(key)) == 2
    assert len(server.effects_for(key)) == 1
    record = client.lookup("s-500")
    assert record is not None
    assert record.state is State.INDETERMINATE


def test_key_reused_with_another_body_is_a_mismatch(
    server: LoopbackServer, make_client: ClientFactory, another_outbox: str
) -> None:
    """Another system reusing our key with a different body gets the provider's mismatch."""
    shared = f"shared-key-{uuid.uuid4().hex[:12]}"  # the server lives for the whole session
    first = make_client(server.base_url, provider="stripe")
    first.post_once("/stripe/v1/charges", json={"amount": 1}, intent="mm", key=shared)
    other = make_client(server.base_url, provider="stripe", outbox=another_outbox)
    with pytest.raises(postonce.IdempotencyKeyMismatch) as exc:
        other.post_once("/stripe/v1/charges", json={"amount": 999}, intent="mm", key=shared)
    assert exc.value.key == shared
    assert len(server.effects_for(shared)) == 1
    assert len(server.requests_for(shared)) == 2


def test_square_body_key_survives_a_timeout(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """A key carried in the JSON body is resent unchanged; one payment."""
    client = make_client(server.base_url, provider="square", timeout=httpx.Timeout(5.0, read=0.5))
    response = client.post_once(
        "/square/v2/payments",
        json={"amount_money": {"amount": 100}, "_test": {"delay": 1.0}},
        intent="sq-pay",
    )
    assert response.status_code == 201
    key = response.extensions["postonce"].key
    assert len(server.effects_for(key)) == 1
    assert len(server.requests_for(key)) >= 2


def test_checkout_header_name(server: LoopbackServer, make_client: ClientFactory) -> None:
    """The checkout profile sends its key as Cko-Idempotency-Key."""
    client = make_client(server.base_url, provider="checkout")
    response = client.post_once("/checkout/payments", json={"amount": 1}, intent="cko")
    assert response.json()["key"] == response.extensions["postonce"].key


def test_two_threads_one_intent_one_effect(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Two clients on one outbox racing the same intent: one sends, both get the answer."""
    clients = [make_client(server.base_url) for _ in range(2)]
    results: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def go(client: postonce.Client) -> None:
        barrier.wait()
        results.append(
            client.post_once(
                "/ietf/v1/charges", json={"amount": 5, "_test": {"delay": 0.3}}, intent="race"
            )
        )

    threads = [threading.Thread(target=go, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    key = results[0].extensions["postonce"].key
    assert {r.extensions["postonce"].key for r in results} == {key}
    assert len(server.effects_for(key)) == 1
    assert len(server.requests_for(key)) == 1
    assert {r.json()["id"] for r in results} == {server.effects_for(key)[0]["id"]}


def test_pending_intent_finished_by_a_later_call(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Budget spent on 503s: IntentPending; the next call with the intent finishes it."""
    client = make_client(server.base_url)
    body = {"amount": 9, "_test": {"before": [{"status": 503, "retry_after": "0"}] * 3}}
    with pytest.raises(postonce.IntentPending) as exc:
        client.post_once(
            "/ietf/v1/charges",
            json=body,
            intent="later",
            retry=FAST.model_copy(update={"attempts": 2}),
        )
    response = client.post_once("/ietf/v1/charges", json=body, intent="later")
    assert response.status_code == 201
    assert response.extensions["postonce"].key == exc.value.key
    assert len(server.effects_for(exc.value.key)) == 1


def _attempt_rows(outbox: postonce.Store, reference: str) -> int:
    """Rows the attempts table itself holds for ``reference`` (not what ``attempts()`` reads)."""
    from postonce._outbox.memory import MemoryOutbox
    from postonce._outbox.sql import SQLStore

    record = outbox.get(reference)
    assert record is not None
    if isinstance(outbox, MemoryOutbox):
        return len(outbox._attempts[record.id])
    assert isinstance(outbox, SQLStore)
    rows = outbox._select("SELECT count(*) FROM {attempts} WHERE intent_id = ?", (record.id,))
    return int(rows[0][0])


def test_a_first_try_answer_is_kept_by_the_intent_row_alone(
    server: LoopbackServer, make_client: ClientFactory, backend: str
) -> None:
    """A first-try 2xx or final 4xx writes no attempts row, yet its attempt is read back.

    Any other history (a retry, a replay) keeps every attempt in the attempts table.
    """
    client = make_client(server.base_url)
    first = client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="carried-2xx")
    declined = client.post_once(
        "/ietf/v1/charges", json={"amount": 1, "_test": {"status": 402}}, intent="carried-402"
    )
    retried = client.post_once(
        "/ietf/v1/charges",
        json={"amount": 1, "_test": {"before": [{"status": 503, "retry_after": "0"}]}},
        intent="logged-retry",
    )
    assert (first.status_code, declined.status_code, retried.status_code) == (201, 402, 201)
    outbox = client.outbox
    # PostgreSQL keeps every attempt with the host that sent it.
    carried_rows = 1 if backend == "postgres" else 0
    for reference, status in (("carried-2xx", 201), ("carried-402", 402)):
        assert _attempt_rows(outbox, reference) == carried_rows
        (attempt,) = outbox.attempts(reference)
        record = outbox.get(reference)
        assert record is not None
        assert attempt.status == status
        assert attempt.outcome is postonce.Outcome.FINAL
        assert (attempt.error_type, attempt.replayed) == (None, False)
        assert record.first_delivery_at is not None
        assert 0 <= attempt.started_at - record.first_delivery_at < 60
        assert 0 <= attempt.duration < 60
    assert _attempt_rows(outbox, "logged-retry") == 2
    assert [a.status for a in outbox.attempts("logged-retry")] == [503, 201]
