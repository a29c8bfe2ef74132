"""postonce.testing: what users' own tests rely on."""

from __future__ import annotations

import httpx
import pytest

import postonce
from postonce import Outcome, RetryPolicy, State
from postonce.testing import MemoryOutbox, is_testing, set_testing


def test_set_testing_removes_waits_and_keeps_the_key() -> None:
    """The shipped policy (waits up to 8 s, Retry-After 60 s) runs without waiting."""
    keys: list[str] = []
    answers = iter([(503, {"Retry-After": "60"}), (503, {}), (201, {})])

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        status, headers = next(answers)
        return httpx.Response(status, headers=headers)

    sleeps: list[float] = []
    seen = postonce.Hooks(on_retry_scheduled=lambda d: sleeps.append(d.wait))
    with (
        set_testing(),
        postonce.Client(
            outbox=MemoryOutbox(),
            transport=httpx.MockTransport(handler),
            retry=RetryPolicy(),
            hooks=seen,
        ) as client,
    ):
        response = client.post_once("https://api.test/c", json={}, intent="t-1")
    assert response.status_code == 201
    assert sleeps == [0.0, 0.0]
    assert len(set(keys)) == 1
    assert len(keys) == 3


def test_set_testing_is_a_switch_and_a_context_manager() -> None:
    assert not is_testing()
    with set_testing():
        assert is_testing()
        with set_testing(False):
            assert not is_testing()
        assert is_testing()
    assert not is_testing()
    set_testing(True)
    try:
        assert is_testing()
    finally:
        set_testing(False)
    assert not is_testing()


def test_in_flight_answers_still_wait_a_little() -> None:
    from postonce._policy import backoff

    with set_testing():
        assert backoff(RetryPolicy(), Outcome.IN_PROGRESS, 1, {}, 0.0) == pytest.approx(0.01)
        assert backoff(RetryPolicy(), Outcome.RETRYABLE, 3, {"retry-after": "30"}, 0.0) == 0.0
    assert backoff(RetryPolicy(), Outcome.RETRYABLE, 1, {"retry-after": "30"}, 0.0) == 30.0


def test_memory_outbox_in_a_users_test() -> None:
    outbox = MemoryOutbox()
    transport = httpx.MockTransport(lambda request: httpx.Response(201, json={"id": "ch_1"}))
    with postonce.Client("https://api.test", outbox=outbox, transport=transport) as client:
        client.post_once("/charges", json={"amount": 100}, intent="order-1/charge")
    record = outbox.get("order-1/charge")
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert [a.outcome for a in outbox.attempts("order-1/charge")] == [Outcome.FINAL]


def test_set_testing_attempts_caps_the_sends() -> None:
    """set_testing(attempts=2): the shipped 5-attempt policy sends twice, then leaves it pending."""
    sent: list[str] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["Idempotency-Key"])
        return httpx.Response(503)

    with (
        set_testing(True, attempts=2),
        postonce.Client(
            "https://api.test", outbox=MemoryOutbox(), transport=httpx.MockTransport(unavailable)
        ) as client,
    ):
        with pytest.raises(postonce.IntentPending):
            client.post_once("/c", json={}, intent="t-cap")
        record = client.lookup("t-cap")
    assert len(sent) == 2
    assert record is not None
    assert record.attempts == 2


def test_set_testing_attempts_keeps_a_smaller_policy() -> None:
    """A policy asking for fewer sends than the cap keeps its own number."""
    sent: list[int] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        return httpx.Response(503)

    with (
        set_testing(True, attempts=3),
        postonce.Client(
            "https://api.test",
            outbox=MemoryOutbox(),
            transport=httpx.MockTransport(unavailable),
            retry=RetryPolicy(attempts=1),
        ) as client,
        pytest.raises(postonce.IntentPending),
    ):
        client.post_once("/c", json={}, intent="t-small")
    assert sent == [1]


def test_set_testing_restores_the_cap_on_exit() -> None:
    """The context manager restores the previous cap; attempts below 1 are refused."""
    with set_testing(True, attempts=1):
        assert is_testing()
    with set_testing(True, attempts=4), set_testing(False):
        assert not is_testing()
    from postonce._policy import TESTING

    assert TESTING.attempts is None
    with pytest.raises(postonce.ConfigurationError, match="attempts"):
        set_testing(True, attempts=0)
