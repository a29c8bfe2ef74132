"""A fenced-out worker returns only what is true (issue: paused workers).

A process that stalls past its lease (a frozen VM, a long GC pause, SIGSTOP)
finds its record refused: another worker took the intent over. Driven by hand
here (the flow's decisions, no I/O), then end to end with a real SIGSTOP in
``test_a_sigstopped_sender_returns_the_answer_the_outbox_holds``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import IntentPending, RetryPolicy, State, get_provider
from postonce._flow import Send, Sender, Sleep, StoreCall, run
from postonce._intent import IntentRecord, StoredResponse
from postonce._outbox.base import Lease, NewIntent, Opened
from tests.conftest import LoopbackServer

NOW = 1000.0
LEASE = 15.0


def new(provider: str) -> NewIntent:
    return NewIntent(
        reference="o-1", key="k-1", key_given=False, provider=provider, method="POST",
        url="https://api.test/c", headers=(), body=b"{}", fingerprint="f", deadline_at=None,
    )  # fmt: skip


def record(provider: str, **changes: Any) -> IntentRecord:
    fields: dict[str, Any] = dict(
        id=1, reference="o-1", key="k-1", provider=provider, method="POST",
        url="https://api.test/c", headers=(), body=b"{}", fingerprint="f",
        state=State.SENDING, created_at=NOW, first_delivery_at=None, due_at=None,
        deadline_at=None, attempts=0, last_outcome=None, lease_owner="me",
        lease_expires_at=NOW + LEASE, response=None, note=None,
    )  # fmt: skip
    fields.update(changes)
    return IntentRecord(**fields)


def claimed(provider: str, **changes: Any) -> Opened:
    return Opened(record(provider, **changes), Lease(1, "t", "me", NOW + LEASE), True, None, None)


def sender(provider: str) -> Sender:
    return Sender(
        provider=get_provider(provider),
        policy=RetryPolicy(timeout=None),
        owner="me",
        lease_seconds=LEASE,
        clock=lambda: NOW,
        build_request=httpx.Client().build_request,
        timeout=None,
    )


def stored(state: State, status: int | None) -> IntentRecord:
    """The intent as the worker that took it over left it."""
    body = b'{"by":"the drain"}'
    answer = None if status is None else StoredResponse(status, (), body, truncated=False)
    return record("checkout", state=state, response=answer, lease_owner="drain")


def answered_then_refused(provider: str, status: int, outbox_holds: IntentRecord) -> Any:
    """Run one intent whose answer is ``status`` and whose record is refused.

    Returns what the call returned, or the exception it raised.
    """
    flow = run(sender(provider), new(provider))
    effect = next(flow)
    assert isinstance(effect, StoreCall)
    assert effect.method == "open_intent"
    effect = flow.send(claimed(provider))
    assert isinstance(effect, Send)
    effect = flow.send(httpx.Response(status, json={"by": "this worker"}, request=effect.request))
    assert isinstance(effect, StoreCall)
    assert effect.method == "record"
    effect = flow.send(False)  # fenced: another worker holds the intent now
    assert isinstance(effect, StoreCall)
    assert effect.method == "get"
    try:
        flow.send(outbox_holds)
    except StopIteration as done:
        return done.value
    except postonce.PostonceError as exc:
        return exc
    raise AssertionError("the flow went on after its record was refused")


@pytest.mark.parametrize(
    ("provider", "status", "outbox_holds", "expected"),
    [
        pytest.param(
            "checkout", 402, stored(State.SUCCEEDED, 201), ("the drain", 201),
            id="checkout-402-outbox-succeeded: the outbox's answer, not the stale decline",
        ),
        pytest.param(
            "checkout", 402, stored(State.PENDING, None), IntentPending,
            id="checkout-402-outbox-pending: pending, never the decline",
        ),
        pytest.param(
            "checkout", 201, stored(State.PENDING, None), ("this worker", 201),
            id="checkout-201: a success is what the provider keeps for the key",
        ),
        pytest.param(
            "stripe", 402, stored(State.PENDING, None), ("this worker", 402),
            id="stripe-402: Stripe replays every executed answer",
        ),
        pytest.param(
            "stripe", 402, stored(State.FAILED, 402), ("the drain", 402),
            id="stripe-402-outbox-final: the stored answer first",
        ),
        pytest.param(
            "checkout", 201, stored(State.EXPIRED, None), postonce.IntentExpired,
            id="checkout-201-outbox-expired: the outbox's ending stands",
        ),
    ],
)  # fmt: skip
def test_a_refused_record_returns_only_what_is_true(
    provider: str, status: int, outbox_holds: IntentRecord, expected: Any
) -> None:
    """Table: the answer a fenced-out worker returns, by profile, status and the outbox's state."""
    got = answered_then_refused(provider, status, outbox_holds)
    if isinstance(expected, type):
        assert isinstance(got, expected), got
    else:
        assert isinstance(got, httpx.Response), got
        assert (got.json()["by"], got.status_code) == expected


def test_a_wait_for_a_due_time_renews_the_lease_past_it_first() -> None:
    """Resuming an intent due in 10 s: the lease is renewed to outlast the wait, then it sleeps."""
    flow = run(sender("stripe"), new("stripe"))
    next(flow)
    effect = flow.send(claimed("stripe", due_at=NOW + 10.0, attempts=1, first_delivery_at=NOW))
    assert isinstance(effect, StoreCall)
    assert effect.method == "renew"
    assert effect.kwargs["until"] == NOW + 10.0 + LEASE  # not NOW + LEASE: the wait is covered
    effect = flow.send(Lease(1, "t", "me", NOW + 10.0 + LEASE))
    assert isinstance(effect, Sleep)
    assert effect.seconds == pytest.approx(10.0)
    effect = flow.send(None)
    assert isinstance(effect, Send)
    assert effect.lease == Lease(1, "t", "me", NOW + 10.0 + LEASE)


def test_a_due_time_reached_during_the_renewal_is_not_slept_for() -> None:
    """The renewal's commit took past the due time: no negative sleep, the send goes out."""
    readings = iter([NOW, NOW, NOW, NOW + 11.0])  # the renewal's commit takes 11 s

    def clock() -> float:
        return next(readings, NOW + 11.0)

    flow = run(replace(sender("stripe"), clock=clock), new("stripe"))
    next(flow)
    effect = flow.send(claimed("stripe", due_at=NOW + 10.0, attempts=1, first_delivery_at=NOW))
    assert isinstance(effect, StoreCall)
    assert effect.method == "renew"
    effect = flow.send(Lease(1, "t", "me", NOW + 10.0 + LEASE))
    assert isinstance(effect, Send)  # before: Sleep(-1.0), which time.sleep refuses


@pytest.mark.parametrize(
    ("outbox_holds", "expected"),
    [
        pytest.param(stored(State.SUCCEEDED, 201), 201, id="taken-and-finished"),
        pytest.param(stored(State.PENDING, None), IntentPending, id="taken-still-pending"),
    ],
)
def test_a_lease_lost_before_a_wait_returns_the_stored_answer_or_pending(
    outbox_holds: IntentRecord, expected: Any
) -> None:
    """A renewal refused before a wait or a send: the outbox's final answer, else IntentPending."""
    flow = run(sender("checkout"), new("checkout"))
    next(flow)
    effect = flow.send(claimed("checkout", due_at=NOW + 10.0, attempts=1, first_delivery_at=NOW))
    assert isinstance(effect, StoreCall)
    assert effect.method == "renew"
    effect = flow.send(None)  # taken over
    assert isinstance(effect, StoreCall)
    assert effect.method == "get"
    if isinstance(expected, type):
        with pytest.raises(expected):
            flow.send(outbox_holds)
    else:
        with pytest.raises(StopIteration) as done:
            flow.send(outbox_holds)
        assert done.value.value.status_code == expected


# --- end to end: a real SIGSTOP -------------------------------------------------------------

WORKER = """
import sys, postonce
from tests.http_library import default_transport
outbox, base_url, path = sys.argv[1], sys.argv[2], sys.argv[3]
options = dict(outbox=outbox, name="paused", provider="checkout", lease_seconds=1.0)
transport = default_transport()
if transport is not None:
    options["transport"] = transport
with postonce.Client(base_url, **options) as client:
    body = {"amount": 1, "_test": {"before": [{"status": 402, "delay": 1.0}]}}
    try:
        response = client.post_once(path, json=body, intent="paused-1")
        print("returned", response.status_code, flush=True)
    except postonce.IntentPending:
        print("pending", flush=True)
"""


def test_a_sigstopped_sender_returns_the_answer_the_outbox_holds(
    tmp_path: Path, server: LoopbackServer
) -> None:
    """Checkout keeps only successes: a worker paused past its lease while its 402 came back
    must not return that 402 once the drain's re-send succeeded (failed before: ``returned 402``).
    """
    outbox = str(tmp_path / "outbox.db")
    path = f"/checkout/payments/{uuid.uuid4().hex}"  # the server is shared: this test's own path
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, outbox, server.base_url, path],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent,
    )
    try:
        deadline = time.monotonic() + 20
        while not any(r["path"] == path for r in server.ledger()["requests"]):
            assert time.monotonic() < deadline, "the worker never sent"
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGSTOP)  # frozen while the server takes 1 s to decline
        time.sleep(2.5)  # its 1 s lease runs out; the 402 waits in its socket
        with postonce.Client(
            server.base_url, outbox=outbox, name="paused", provider="checkout"
        ) as drain:
            report = drain.drain()
            assert report.succeeded == 1  # the re-send is executed: Checkout kept no decline
            lookup = drain.lookup("paused-1")
            assert lookup is not None
            assert lookup.state is State.SUCCEEDED
        os.kill(worker.pid, signal.SIGCONT)
        out, _ = worker.communicate(timeout=20)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
    assert out.split() == ["returned", "201"]


@pytest.mark.parametrize(
    ("outbox_holds", "expected"),
    [
        pytest.param(stored(State.SUCCEEDED, 201), 201, id="the-drain-charged"),
        pytest.param(stored(State.PENDING, None), IntentPending, id="still-under-way"),
    ],
)
def test_a_stall_past_the_deadline_is_not_told_cancelled_when_another_worker_took_over(
    outbox_holds: IntentRecord, expected: Any
) -> None:
    """A send that never left, a retry slept past the lease and the deadline: the settle as
    cancelled is refused (a drain took the intent over). Before: IntentCancelled, though the
    drain's send was executed; now the outbox's answer, or IntentPending."""
    now = [NOW]
    stalled = replace(sender("checkout"), clock=lambda: now[0], policy=RetryPolicy(timeout=None))
    flow = run(stalled, new("checkout")._replace(deadline_at=NOW + 30.0))
    next(flow)
    effect = flow.send(claimed("checkout", deadline_at=NOW + 30.0))
    assert isinstance(effect, Send)
    effect = flow.throw(httpx.ConnectError("refused", request=effect.request))  # never sent
    assert isinstance(effect, StoreCall)
    assert effect.method == "record"
    effect = flow.send(True)
    assert isinstance(effect, Sleep)
    now[0] = NOW + 100.0  # frozen well past its lease and its deadline
    effect = flow.send(None)
    assert isinstance(effect, StoreCall)
    assert effect.method == "settle"
    effect = flow.send(False)  # refused: another worker holds the intent
    assert isinstance(effect, StoreCall)
    assert effect.method == "get"
    if isinstance(expected, type):
        with pytest.raises(expected):
            flow.send(outbox_holds)
    else:
        with pytest.raises(StopIteration) as done:
            flow.send(outbox_holds)
        assert done.value.value.status_code == expected
