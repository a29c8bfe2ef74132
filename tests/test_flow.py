"""The flow's decisions, driven by hand: effects in, effects out, no I/O."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from postonce import Outcome, RetryPolicy, State, get_provider
from postonce._flow import Send, Sender, Sleep, StoreCall, run
from postonce._intent import IntentRecord
from postonce._outbox.base import Lease, NewIntent, Opened

NEW = NewIntent(
    reference="o-1", key="k-1", key_given=False, provider="ietf_draft", method="POST",
    url="https://api.test/c", headers=(), body=b"{}", fingerprint="f", deadline_at=None,
)  # fmt: skip


def held_by_another(now: float, lease_until: float) -> Opened:
    record = IntentRecord(
        id=1, reference="o-1", key="k-1", provider="ietf_draft", method="POST",
        url="https://api.test/c", headers=(), body=b"{}", fingerprint="f",
        state=State.SENDING, created_at=now, first_delivery_at=now, due_at=None,
        deadline_at=None, attempts=0, last_outcome=None, lease_owner="other",
        lease_expires_at=lease_until, response=None, note=None,
    )  # fmt: skip
    return Opened(record, None, created=False, conflict=None, anchor_before=now)


def stored_under(provider: str, now: float) -> Opened:
    """A pending intent stored under ``provider``, just claimed by this caller."""
    record = IntentRecord(
        id=1, reference="o-1", key="k-1", provider=provider, method="POST",
        url="https://api.test/c", headers=(), body=b"{}", fingerprint="f",
        state=State.SENDING, created_at=now, first_delivery_at=now, due_at=None,
        deadline_at=None, attempts=1, last_outcome=None, lease_owner="me",
        lease_expires_at=now + 120, response=None, note=None,
    )  # fmt: skip
    return Opened(record, Lease(1, "t", "me", now + 120), False, None, anchor_before=now)


def sender(policy: RetryPolicy, clock: Any) -> Sender:
    return Sender(
        provider=get_provider("ietf_draft"),
        policy=policy,
        owner="me",
        lease_seconds=120.0,
        clock=clock,
        build_request=httpx.Client().build_request,
        timeout=None,
    )


@pytest.mark.parametrize(
    ("lease_left", "expected"),
    [
        pytest.param(100.0, [0.25, 0.5, 1.0, 2.0, 2.0], id="long-lease: doubling to the max"),
        pytest.param(0.6, [0.25, 0.5, 0.6, 0.6, 0.6], id="short-lease: never past its end"),
    ],
)
def test_waiting_on_another_sender_polls_soon_then_backs_off(
    lease_left: float, expected: list[float]
) -> None:
    """A second caller of a busy intent looks again after in_flight_initial, doubling."""
    now = 1000.0
    policy = RetryPolicy(timeout=None, in_flight_initial=0.25, in_flight_max=2.0)
    flow = run(sender(policy, lambda: now), NEW)
    effect = next(flow)
    waits: list[float] = []
    for _ in expected:
        assert isinstance(effect, StoreCall)
        assert effect.method == "open_intent"
        effect = flow.send(held_by_another(now, now + lease_left))
        assert isinstance(effect, Sleep)
        waits.append(effect.seconds)
        effect = flow.send(None)
    assert waits == pytest.approx(expected)


@pytest.mark.parametrize(
    ("transport_reads", "expected"),
    [
        pytest.param(lambda r: None, Outcome.NOT_SENT, id="body-never-read"),
        pytest.param(lambda r: r.read(), Outcome.AMBIGUOUS, id="read"),
        pytest.param(lambda r: r.content, Outcome.AMBIGUOUS, id="content-taken"),
        pytest.param(lambda r: list(r.stream), Outcome.AMBIGUOUS, id="stream-iterated"),
    ],
)
def test_not_sent_only_when_the_body_was_never_read(
    transport_reads: Any, expected: Outcome
) -> None:
    """The same ConnectTimeout is NOT_SENT only if the transport never took the body."""
    now = 1000.0
    flow = run(sender(RetryPolicy(attempts=1), lambda: now), NEW)
    next(flow)
    fresh = stored_under("ietf_draft", now)
    fresh = fresh._replace(record=replace(fresh.record, first_delivery_at=None))
    effect = flow.send(fresh._replace(anchor_before=None))
    assert isinstance(effect, Send)
    transport_reads(effect.request)
    effect = flow.throw(httpx.ConnectTimeout("mapped by some transport"))
    assert isinstance(effect, StoreCall)
    assert effect.method == "record"
    assert effect.kwargs["attempt"].outcome is expected
