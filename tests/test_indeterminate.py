"""An answer that leaves the effect unknown is its own ending: reconciled, settled once.

End to end against the Stripe emulator (tests/provider_emulators.py): Stripe
stores the result of a request that failed with a 500 and replays it for the
same key, and its documentation calls a 500 indeterminate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import postonce
from postonce import (
    EndDetail,
    Hooks,
    IntentIndeterminate,
    IntentResolved,
    Resolution,
    Settlement,
    State,
)
from tests.conftest import FAST, ClientFactory, OutboxUnderTest, _serve
from tests.provider_emulators import Emulator


@pytest.fixture
def stripe_api() -> Iterator[tuple[Emulator, str]]:
    """The Stripe family's emulator on its own loopback port."""
    app = Emulator("replayed")
    uv, thread, port = _serve(app)  # type: ignore[arg-type]
    yield app, f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(timeout=10)


class Shop:
    """The application's side: its settlement handler and its reconciler, recorded."""

    def __init__(self, answer: Resolution | None = None) -> None:
        self.settlements: list[Settlement] = []
        self.asked: list[str] = []
        self.answer = answer

    def on_settled(self, settlement: Settlement) -> None:
        self.settlements.append(settlement)

    def reconcile(self, record: postonce.IntentRecord) -> Resolution | None:
        self.asked.append(record.reference)
        return self.answer


def _client(url: str, outbox: OutboxUnderTest | Path, shop: Shop, **kwargs: Any) -> postonce.Client:
    return postonce.Client(
        url, provider="stripe", outbox=outbox, retry=FAST, on_settled=shop.on_settled, **kwargs
    )


@pytest.mark.parametrize(
    ("script", "requests"),
    [
        pytest.param({"fail": 1, "should_retry": False}, 1, id="stored-500-should-retry-false"),
        pytest.param({"fail": 1}, 2, id="stored-500-then-its-replay"),
        pytest.param(
            {"fail": 1, "should_retry": False, "slow_first": 0.5},
            2,
            id="answer-lost-then-replayed-500-should-retry-false",
        ),
    ],
)
def test_a_stored_500_is_reconciled_and_settled_once(
    stripe_api: tuple[Emulator, str],
    make_client: ClientFactory,
    script: dict[str, Any],
    requests: int,
) -> None:
    """Stripe's stored 500 ends indeterminate, not failed; the reconciler's answer settles once."""
    app, url = stripe_api
    shop = Shop(Resolution.succeeded("charge found by metadata"))
    ended: list[EndDetail] = []
    client = make_client(
        url,
        provider="stripe",
        on_settled=shop.on_settled,
        reconcile=shop.reconcile,
        hooks=Hooks(on_end=ended.append),
    )
    with pytest.raises(IntentIndeterminate) as raised:
        client.post_once("/v1/charges", json=script, intent="order-1/charge", timeout=0.25)
    key = raised.value.key
    assert raised.value.response is not None
    replayed = raised.value.response.extensions["postonce"].replayed
    assert replayed is (requests == 2)  # the second answer is Stripe's replay
    assert raised.value.response is not None
    assert raised.value.response.status_code == 500
    assert [d.state for d in ended] == [State.INDETERMINATE]
    record = client.lookup("order-1/charge")
    assert record is not None
    assert record.state is State.INDETERMINATE
    assert shop.settlements == []  # a reconciler is set: it speaks first

    report = client.drain()
    assert shop.asked == ["order-1/charge"]
    assert report.reconciled == 1
    assert [(s.intent, s.state) for s in shop.settlements] == [("order-1/charge", State.SUCCEEDED)]
    assert shop.settlements[0].response is None  # the 500 is not the answer of a charge found

    client.drain()  # a second pass neither asks again nor settles again
    assert shop.asked == ["order-1/charge"]
    assert len(shop.settlements) == 1

    with pytest.raises(IntentResolved) as again:
        client.post_once("/v1/charges", json=script, intent="order-1/charge")
    assert again.value.state == "succeeded"
    assert app.requests[key] == requests  # nothing was sent after the replayed 500
    assert app.effects[key] == 1


def test_an_indeterminate_ending_is_logged_as_a_warning(
    stripe_api: tuple[Emulator, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An indeterminate ending is a WARNING on the postonce logger naming the intent and key."""
    _, url = stripe_api
    client = _client(url, tmp_path / "o.sqlite3", Shop())
    with client, pytest.raises(IntentIndeterminate) as raised:
        client.post_once(
            "/v1/charges", json={"fail": 1, "should_retry": False}, intent="order-5/charge"
        )
    warnings = [r for r in caplog.records if r.name == "postonce" and r.levelname == "WARNING"]
    assert any(
        getattr(r, "intent", None) == "order-5/charge"
        and getattr(r, "key", None) == raised.value.key
        and "indeterminate" in r.getMessage()
        for r in warnings
    )


def test_without_a_reconciler_the_handler_hears_indeterminate_then_the_resolution(
    stripe_api: tuple[Emulator, str], tmp_path: Path
) -> None:
    """Without a reconciler, the handler gets the unresolved state, and a later resolve a second."""
    _, url = stripe_api
    shop = Shop()
    with _client(url, tmp_path / "o.sqlite3", shop) as client:
        with pytest.raises(IntentIndeterminate):
            client.post_once(
                "/v1/charges", json={"fail": 1, "should_retry": False}, intent="order-2/charge"
            )
        assert [s.state for s in shop.settlements] == [State.INDETERMINATE]
        client.resolve("order-2/charge", State.FAILED, note="no charge in the dashboard")
        assert [s.state for s in shop.settlements] == [State.INDETERMINATE, State.FAILED]


def test_a_reconciler_that_cannot_tell_yet_leaves_it_unsettled(
    stripe_api: tuple[Emulator, str], tmp_path: Path
) -> None:
    """A reconciler answering None leaves the intent indeterminate and its handler uncalled."""
    _, url = stripe_api
    shop = Shop(answer=None)
    with _client(url, tmp_path / "o.sqlite3", shop, reconcile=shop.reconcile) as client:
        with pytest.raises(IntentIndeterminate):
            client.post_once(
                "/v1/charges", json={"fail": 1, "should_retry": False}, intent="order-3/charge"
            )
        report = client.drain()
        record = client.lookup("order-3/charge")
    assert shop.asked == ["order-3/charge"]
    assert report.reconciled == 0
    assert shop.settlements == []
    assert record is not None
    assert record.state is State.INDETERMINATE


def test_an_indeterminate_intent_is_never_purged(
    stripe_api: tuple[Emulator, str], tmp_path: Path
) -> None:
    """Purge keeps an unresolved intent whatever its age: it still needs an answer."""
    _, url = stripe_api
    shop = Shop()
    with _client(url, tmp_path / "o.sqlite3", shop) as client:
        with pytest.raises(IntentIndeterminate):
            client.post_once(
                "/v1/charges", json={"fail": 1, "should_retry": False}, intent="order-4/charge"
            )
        client.outbox.purge(before=float("inf"), tombstones=False, now=0.0)
        record = client.lookup("order-4/charge")
    assert record is not None
    assert record.purged_at is None
    assert record.state is State.INDETERMINATE
