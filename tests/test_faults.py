"""Bad days on purpose: hostile servers, a failing outbox, clocks that jump."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

import postonce
from postonce import SQLiteStore, State
from tests.conftest import FAST, ClientFactory, LoopbackServer

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    """A wall clock that can jump: real time plus an offset the test moves."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


# -- hostile servers ---------------------------------------------------------------------


def test_409_forever_expires_at_the_horizon_never_fails(make_client: ClientFactory) -> None:
    """A server that answers 409 forever: pending until the horizon, then expired, not failed."""
    short = postonce.Provider(name="short", retention=timedelta(seconds=0.5))
    sent: list[httpx.Request] = []

    def busy(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(409)

    client = make_client(provider=short, transport=httpx.MockTransport(busy))
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="busy")
    record = client.lookup("busy")
    assert record is not None
    assert record.state is State.EXPIRED
    assert len(sent) > 1
    assert {a.outcome.value for a in client.outbox.attempts("busy")} == {"in_progress"}


def test_garbage_retry_after_falls_back_to_backoff(make_client: ClientFactory) -> None:
    """Retry-After: soon-ish is ignored; the backoff schedule still retries and succeeds."""
    answers = iter([httpx.Response(503, headers={"Retry-After": "soon-ish"}), httpx.Response(201)])
    client = make_client(transport=httpx.MockTransport(lambda r: next(answers)))
    assert client.post_once("/c", json={}, intent="garbage").status_code == 201


def test_huge_retry_after_never_waits_past_the_horizon(make_client: ClientFactory) -> None:
    """Retry-After: 999999 with a short horizon: expired now, rather than sent too late."""
    short = postonce.Provider(name="short", retention=timedelta(seconds=30))
    client = make_client(
        provider=short,
        transport=httpx.MockTransport(
            lambda r: httpx.Response(503, headers={"Retry-After": "999999"})
        ),
        retry=FAST.model_copy(update={"retry_after_max": 3600.0}),
    )
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="huge")
    assert len(client.outbox.attempts("huge")) == 1


def test_a_replay_with_another_body_is_returned_as_replayed(make_client: ClientFactory) -> None:
    """A replay whose body differs from the lost first answer is the answer: kept, marked."""
    replay = httpx.Response(
        200, json={"status": "COMPLETED"}, headers={"Idempotent-Replayed": "true"}
    )
    answers: list[httpx.Response | Exception] = [httpx.ReadTimeout("first answer lost"), replay]

    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = make_client(transport=httpx.MockTransport(handler))
    response = client.post_once("/c", json={}, intent="latest")
    assert response.json() == {"status": "COMPLETED"}
    assert response.extensions["postonce"].replayed is True
    again = client.post_once("/c", json={}, intent="latest")
    assert again.json() == {"status": "COMPLETED"}


def test_connection_closed_mid_body_is_ambiguous_then_replayed(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The server executes, then cuts the answer mid-body: retried with the key, one charge."""
    client = make_client(server.base_url)
    response = client.post_once(
        "/ietf/v1/charges", json={"amount": 1, "_test": {"drop_first": True}}, intent="cut"
    )
    key = response.extensions["postonce"].key
    assert response.extensions["postonce"].replayed is True
    assert client.outbox.attempts("cut")[0].outcome.value == "ambiguous"
    assert len(server.effects_for(key)) == 1


def record_and_answer(sent: list[httpx.Request], request: httpx.Request) -> httpx.Response:
    sent.append(request)
    return httpx.Response(201)


# -- a failing outbox --------------------------------------------------------------------

_HOLD_LOCK = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    conn.execute("ROLLBACK")
    """
)


def test_outbox_locked_by_another_process_past_the_busy_timeout(outbox_path: Path) -> None:
    """Another process holds the write lock too long: OutboxError naming the intent, no send."""
    SQLiteStore(outbox_path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(outbox_path), "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    sent: list[httpx.Request] = []
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        store = SQLiteStore(outbox_path, busy_timeout=0.3)
        client = postonce.Client(
            "http://api.test",
            outbox=store,
            transport=httpx.MockTransport(lambda r: record_and_answer(sent, r)),
        )
        with pytest.raises(postonce.OutboxError, match="locked") as exc:
            client.post_once("/c", json={}, intent="locked-out")
        assert exc.value.intent == "locked-out"
        assert sent == []
    finally:
        holder.kill()
        holder.wait()
    assert store.get("locked-out") is None
    store.close()


def test_disk_full_during_the_write_ahead(outbox_path: Path) -> None:
    """The disk fills during the write-ahead commit: OutboxError, nothing sent, no half row."""
    store = SQLiteStore(outbox_path)
    sent: list[httpx.Request] = []
    client = postonce.Client(
        "http://api.test",
        outbox=store,
        transport=httpx.MockTransport(lambda r: record_and_answer(sent, r)),
    )
    client.post_once("/c", json={"n": 0}, intent="fits")
    # Emulate a full disk: SQLite may not grow the file by one more page.
    # (The store's connection is private; this is the emulation the issue names.)
    (pages,) = store._conn.execute("PRAGMA page_count").fetchone()
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(postonce.OutboxError, match="full") as exc:
        client.post_once("/c", json={"n": "x" * 200_000}, intent="too-big")
    assert exc.value.intent == "too-big"
    assert len(sent) == 1
    assert store.get("too-big") is None
    assert [r.reference for r in store.list_intents()] == ["fits"]
    store.close()


# -- clocks --------------------------------------------------------------------------------


def test_clock_jumping_forward_expires_rather_than_sending_late(
    make_client: ClientFactory,
) -> None:
    """The clock jumps past the horizon between attempts: expired, never sent late."""
    clock = Clock()
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(clock())
        clock.offset += 2 * 86400  # two days pass (as far as the wall clock says)
        raise httpx.ReadTimeout("lost", request=request)

    client = make_client(provider="stripe", clock=clock, transport=httpx.MockTransport(handler))
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="fwd")
    assert len(sent) == 1


def test_clock_jumping_back_expires_rather_than_trusting_old_times(
    make_client: ClientFactory,
) -> None:
    """The clock goes back hours between attempts: the time since the send is unknown: expired."""
    clock = Clock()
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(clock())
        clock.offset -= 6 * 3600
        raise httpx.ReadTimeout("lost", request=request)

    client = make_client(provider="stripe", clock=clock, transport=httpx.MockTransport(handler))
    with pytest.raises(postonce.IntentExpired, match="clock went back"):
        client.post_once("/c", json={}, intent="back")
    assert len(sent) == 1


def test_clock_jumping_back_across_a_restart_still_fires_due_times(
    make_client: ClientFactory,
) -> None:
    """Pending with a due time, then the clock goes back a day: the drain still takes it."""
    clock = Clock()
    answers = iter([httpx.Response(503, headers={"Retry-After": "30"}), httpx.Response(201)])
    client = make_client(clock=clock, transport=httpx.MockTransport(lambda r: next(answers)))
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="due", retry=FAST.model_copy(update={"attempts": 1}))
    clock.offset -= 86400  # the machine comes back a day in the past
    report = client.drain()
    # The intent may have been delivered (a 503 is an answer), so it is not sent late:
    # it is due, claimed, and expired for reconciliation, never left waiting a day.
    assert report.claimed == 1
    assert report.expired == 1
    record = client.lookup("due")
    assert record is not None
    assert record.state is State.EXPIRED


def test_clock_jumping_back_fires_never_sent_intents(make_client: ClientFactory) -> None:
    """A never-delivered intent due later, then the clock goes back: sent now, once."""
    clock = Clock()
    sent: list[httpx.Request] = []
    answers: list[httpx.Response | Exception] = [httpx.ConnectError("refused"), httpx.Response(201)]

    class Scripted(httpx.BaseTransport, httpx.AsyncBaseTransport):
        """Raises without reading the body (nothing can have been sent), else answers."""

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            request.read()
            return answer

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return self.handle_request(request)

    client = make_client(clock=clock, transport=Scripted())
    with pytest.raises(postonce.IntentPending):
        client.post_once(
            "/c", json={}, intent="never", retry=FAST.model_copy(update={"attempts": 1})
        )
    clock.offset -= 86400
    report = client.drain()
    assert (report.claimed, report.succeeded) == (1, 1)
    assert len(sent) == 2
