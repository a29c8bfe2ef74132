"""Peers' retry rules, end to end against the provider emulators (tests/provider_emulators.py).

Each emulator is served on its own loopback port and answers the way its
provider documents: AWS refuses a request it throttles with a 400 before
executing it (the SDKs' standard mode retries it with the same token); Stripe
answers a request whose key another request holds with a 409, which its SDKs
do not retry when ``Stripe-Should-Retry: false`` comes with it; a server
following the IETF draft answers a key reused with another body with a 422 and
``Link: <...>; rel="describedby"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import postonce
from postonce._intent import Outcome, State
from tests.conftest import FAST, _serve
from tests.provider_emulators import Emulator


@pytest.fixture
def serve() -> Iterator[Callable[[Emulator], str]]:
    """Serve emulators on loopback ports for one test; stop them after it."""
    servers = []

    def start(app: Emulator) -> str:
        uv, thread, port = _serve(app)  # type: ignore[arg-type]
        servers.append((uv, thread))
        return f"http://127.0.0.1:{port}"

    yield start
    for uv, thread in servers:
        uv.should_exit = True
        thread.join(timeout=10)


def test_aws_throttling_400_is_retried_with_the_same_client_token(
    serve: Callable[[Emulator], str], tmp_path: Path
) -> None:
    """Two RequestLimitExceeded 400s, then success: one ClientToken, three sends, one effect."""
    app = Emulator("retry", key_field="ClientToken")
    url = serve(app)
    with postonce.Client(
        url, provider="aws_client_token", outbox=tmp_path / "o.sqlite3", retry=FAST
    ) as client:
        response = client.post_once("/", json={"throttle": 2}, intent="run-instances/1")
        attempts = client.outbox.attempts("run-instances/1")
        record = client.lookup("run-instances/1")
    key = response.extensions["postonce"].key
    assert response.status_code == 201
    assert list(app.requests) == [key]  # every send carried the one token
    assert app.requests[key] == 3
    assert app.effects[key] == 1
    assert [a.outcome for a in attempts] == [Outcome.RETRYABLE, Outcome.RETRYABLE, Outcome.FINAL]
    assert record is not None
    assert record.state is State.SUCCEEDED


def test_stripe_409_with_should_retry_false_is_not_retried(
    serve: Callable[[Emulator], str], tmp_path: Path
) -> None:
    """A 409 with Stripe-Should-Retry: false to a fresh key is the answer: one send, no retry."""
    app = Emulator("replayed")
    url = serve(app)
    with postonce.Client(url, provider="stripe", outbox=tmp_path / "o.sqlite3", retry=FAST) as c:
        response = c.post_once(
            "/v1/charges", json={"conflict": 5, "should_retry": False}, intent="order-9/charge"
        )
    key = response.extensions["postonce"].key
    assert response.status_code == 409
    assert app.requests[key] == 1
    assert app.effects.get(key, 0) == 0


def test_stripe_409_without_a_hint_waits_on_the_same_key(
    serve: Callable[[Emulator], str], tmp_path: Path
) -> None:
    """Without the hint a 409 is in flight: waited on, the same key sent again, executed once."""
    app = Emulator("replayed")
    url = serve(app)
    with postonce.Client(url, provider="stripe", outbox=tmp_path / "o.sqlite3", retry=FAST) as c:
        response = c.post_once("/v1/charges", json={"conflict": 2}, intent="order-10/charge")
    key = response.extensions["postonce"].key
    assert response.status_code == 201
    assert app.requests[key] == 3
    assert app.effects[key] == 1


def test_ietf_422_describedby_raises_key_mismatch(
    serve: Callable[[Emulator], str], tmp_path: Path
) -> None:
    """A key reused with another body gets the draft's 422 + Link describedby: a mismatch."""
    app = Emulator("ietf")
    url = serve(app)
    key = "5b1f3c2e-9a41-4c7e-8f0d-2d6f4b8a1c93"
    # Two services with their own outboxes, one key: the second body is not the first's.
    with postonce.Client(url, provider="ietf_draft", outbox=tmp_path / "a.sqlite3") as first:
        done = first.post_once("/orders", json={"amount": 1}, intent="order-11", key=key)
    with postonce.Client(
        url, provider="ietf_draft", outbox=tmp_path / "b.sqlite3", retry=FAST
    ) as second:
        with pytest.raises(postonce.IdempotencyKeyMismatch) as raised:
            second.post_once("/orders", json={"amount": 2}, intent="order-12", key=key)
        record = second.lookup("order-12")
    assert done.status_code == 201
    assert raised.value.key == key
    assert app.requests[key] == 2  # the mismatch was not retried
    assert app.effects[key] == 1
    assert record is not None
    assert record.state is State.FAILED
