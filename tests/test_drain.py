"""The drain: due claims, leases, due times, the horizon, tombstones, operator moves."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from datetime import timedelta

import httpx
import pytest

import postonce
from postonce import State
from postonce._drain import Turns
from postonce._intent import IllegalMove
from postonce._outbox.locate import open_store
from tests.conftest import FAST, ClientFactory, LoopbackServer, loopback_intent
from tests.unread_transport import UnreadMock

ONE = FAST.model_copy(update={"attempts": 1})


def pending_via_503(
    client: postonce.Client, intent: str, retry_after: str = "0", delay: float = 0.0
) -> str:
    """Leave an intent pending: its only foreground attempt meets a 503.

    ``delay``: seconds the server then takes to execute it (the drain's send).
    """
    test: dict[str, object] = {"before": [{"status": 503, "retry_after": retry_after}]}
    if delay:
        test["delay"] = delay
    with pytest.raises(postonce.IntentPending) as exc:
        client.post_once(
            "/ietf/v1/charges",
            json={"amount": 1, "_test": test},
            intent=intent,
            retry=ONE,
        )
    return exc.value.key


def test_drain_finishes_pending_intents_with_their_keys(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Intents the foreground gave up on are sent by the drain with their own keys, once."""
    client = make_client(server.base_url)
    keys = [pending_via_503(client, f"d-{i}") for i in range(5)]
    report = client.drain()
    assert (report.claimed, report.succeeded, report.sent) == (5, 5, 5)
    assert report.ok
    for i, key in enumerate(keys):
        assert len(server.effects_for(key)) == 1
        record = client.lookup(f"d-{i}")
        assert record is not None
        assert record.state is State.SUCCEEDED
    assert client.drain().claimed == 0


def test_drain_takes_over_a_dead_senders_lease(
    server: LoopbackServer, make_client: ClientFactory, outbox: str
) -> None:
    """An intent whose sender died mid-send is due once its lease expires; same key."""
    client = make_client(server.base_url)
    client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="warmup")
    store = open_store(outbox)  # another process's connection to the same outbox
    prepared_key = f"dead-sender-{uuid.uuid4().hex[:12]}"  # the server outlives this test
    # Written by another process of the same client.
    new = loopback_intent(
        server, "dead", key=prepared_key, sender=client.sender, body=b'{"amount":2}'
    )
    opened = store.open_intent(new, owner="dead-host/1", now=time.time(), lease_for=0.3)
    store.close()
    assert opened.lease is not None
    assert client.drain().claimed == 0  # the lease is still live
    time.sleep(0.35)
    report = client.drain()
    assert (report.claimed, report.succeeded) == (1, 1)
    assert len(server.effects_for(prepared_key)) == 1


def test_retry_minutes_away_is_a_due_time_not_a_sleep(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """A 503 with Retry-After: 50 in the drain stores the due time and returns at once."""
    client = make_client(server.base_url)
    body = {
        "amount": 3,
        "_test": {
            "before": [{"status": 503, "retry_after": "0"}, {"status": 503, "retry_after": "50"}]
        },
    }
    with pytest.raises(postonce.IntentPending):
        client.post_once("/ietf/v1/charges", json=body, intent="later", retry=ONE)
    before = time.time()
    report = client.drain()
    assert (report.claimed, report.sent, report.pending) == (1, 1, 1)
    record = client.lookup("later")
    assert record is not None
    assert record.state is State.PENDING
    assert record.due_at is not None
    assert record.due_at >= before + 49
    assert client.drain().claimed == 0


def test_drain_expires_past_the_horizon_and_warns(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Past the horizon with delivery ambiguous, the drain expires the intent, sends nothing."""
    short = postonce.Provider(name="short", retention=timedelta(seconds=0.3))
    sent: list[httpx.Request] = []

    def timeout(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.ReadTimeout("lost", request=request)

    client = make_client(provider=short, transport=httpx.MockTransport(timeout))
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="h-1", retry=ONE)
    time.sleep(0.35)
    with caplog.at_level(logging.WARNING, logger="postonce"):
        report = client.drain()
    assert (report.claimed, report.expired, report.sent) == (1, 1, 0)
    assert not report.ok
    assert len(sent) == 1
    assert any("h-1" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert client.outbox.stats(now=time.time())["expired_needing_attention"] == 1


def test_foreground_and_drain_never_send_one_intent_at_once(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """While post_once holds the lease, drains running alongside do not send the intent."""
    client = make_client(server.base_url)
    drainer = make_client(server.base_url)
    done = threading.Event()
    reports: list[postonce.DrainReport] = []

    def drain_loop() -> None:
        while not done.is_set():
            reports.append(drainer.drain())

    thread = threading.Thread(target=drain_loop)
    thread.start()
    try:
        response = client.post_once(
            "/ietf/v1/charges", json={"amount": 4, "_test": {"delay": 0.8}}, intent="fg"
        )
    finally:
        done.set()
        thread.join()
    key = response.extensions["postonce"].key
    assert len(server.requests_for(key)) == 1
    assert server.ledger()["max_concurrent"][key] == 1
    assert sum(r.claimed for r in reports) == 0
    assert len(reports) > 1


def test_purge_keeps_a_tombstone_that_refuses_a_second_execution(
    make_client: ClientFactory,
) -> None:
    """A purged intent cannot run again under its reference until its tombstone goes too."""
    sent: list[httpx.Request] = []

    def ok(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201, json={"id": "x"})

    client = make_client(transport=httpx.MockTransport(ok))
    client.post_once("/c", json={"a": 1}, intent="old")
    store = client.outbox
    assert store.purge(before=time.time() + 1, tombstones=False, now=time.time()) == 1
    with pytest.raises(postonce.IntentPurged) as exc:
        client.post_once("/c", json={"a": 1}, intent="old")
    assert exc.value.intent == "old"
    with pytest.raises(postonce.IntentConflict):
        client.post_once("/c", json={"a": 2}, intent="old")
    assert len(sent) == 1
    record = store.get("old")
    assert record is not None
    assert record.body == b""
    assert record.response is not None  # the outcome stays in the tombstone, the answer goes
    assert (record.response.status, record.response.body) == (201, b"")
    assert store.attempts("old") == []
    assert store.stats(now=time.time())["tombstones"] == 1
    assert store.purge(before=time.time() + 1, tombstones=True, now=time.time()) == 1
    assert store.get("old") is None


def test_purge_leaves_unfinished_and_recent_intents(make_client: ClientFactory) -> None:
    """Only terminal intents older than the cut-off are purged."""
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="open", retry=ONE)
    store = client.outbox
    assert store.purge(before=time.time() + 1, tombstones=False, now=time.time()) == 0
    assert store.purge(before=time.time() - 3600, tombstones=False, now=time.time()) == 0


def connect_error(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def test_operator_cancel_only_when_never_delivered(make_client: ClientFactory) -> None:
    """Cancel works on a never-delivered intent; on a maybe-delivered one it says why not."""
    client = make_client(transport=UnreadMock(connect_error))
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent="never", retry=ONE)
    store = client.outbox
    cancelled = store.operator_move("never", State.CANCELLED, now=time.time(), note="n")
    assert cancelled.state is State.CANCELLED
    with pytest.raises(postonce.IntentCancelled):
        client.post_once("/c", json={}, intent="never")

    maybe = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    with pytest.raises(postonce.IntentPending):
        maybe.post_once("/c", json={}, intent="maybe", retry=ONE)
    with pytest.raises(IllegalMove, match="may have been delivered"):
        store.operator_move("maybe", State.CANCELLED, now=time.time(), note="n")


def test_operator_resolve_only_from_expired(make_client: ClientFactory) -> None:
    """An expired intent is resolved by hand; a pending one is not."""
    short = postonce.Provider(name="short", retention=timedelta(seconds=0.2))
    client = make_client(
        provider=short,
        transport=httpx.MockTransport(lambda r: httpx.Response(503)),
        retry=FAST.model_copy(update={"attempts": 1000}),
    )
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="exp")
    store = client.outbox
    with pytest.raises(IllegalMove):
        store.operator_move("exp", State.CANCELLED, now=time.time(), note="n")
    resolved = store.operator_move("exp", State.SUCCEEDED, now=time.time(), note="ch_1 found")
    assert resolved.state is State.SUCCEEDED
    with pytest.raises(IllegalMove, match="only an expired"):
        store.operator_move("exp", State.FAILED, now=time.time(), note="again")
    with pytest.raises(postonce.IntentResolved) as exc:
        client.post_once("/c", json={}, intent="exp")
    assert (exc.value.state, exc.value.note) == ("succeeded", "ch_1 found")


def test_purge_keeps_unresolved_expired_intents(make_client: ClientFactory) -> None:
    """An expired intent is never purged before a person resolves it."""
    short = postonce.Provider(name="short", retention=timedelta(seconds=0.2))
    client = make_client(
        provider=short,
        transport=httpx.MockTransport(lambda r: httpx.Response(503)),
        retry=FAST.model_copy(update={"attempts": 1000}),
    )
    with pytest.raises(postonce.IntentExpired):
        client.post_once("/c", json={}, intent="exp2")
    store = client.outbox
    assert store.purge(before=time.time() + 1, tombstones=False, now=time.time()) == 0
    assert store.stats(now=time.time())["expired_needing_attention"] == 1


def test_drain_stop_event_releases_unsent_claims(
    server: LoopbackServer, make_sync_client: ClientFactory
) -> None:
    """A stop requested before a claimed intent is sent releases it, still pending."""
    client = make_sync_client(server.base_url)
    for i in range(3):
        pending_via_503(client, f"stop-{i}")
    stop = threading.Event()
    stop_after_first: list[postonce.DrainReport] = []

    def progress(report: postonce.DrainReport) -> None:
        stop_after_first.append(report)

    stop.set()
    report = client.drain(stop=stop, progress=progress)
    assert report.claimed == 0
    # Now stop from inside the first send: the other claims of the batch are released.
    stop.clear()
    original = client._http.send

    def send_then_stop(request: httpx.Request, **kwargs: object) -> httpx.Response:
        stop.set()
        return original(request)

    client._http.send = send_then_stop  # type: ignore[method-assign]
    report = client.drain(stop=stop)
    assert (report.claimed, report.succeeded, report.pending) == (3, 1, 2)
    leased = [r for r in client.outbox.list_intents() if r.lease_owner is not None]
    assert leased == []


def test_a_flow_that_raises_past_the_drain_stops_the_other_flows_taking_more(
    server: LoopbackServer, make_sync_client: ClientFactory
) -> None:
    """SystemExit from one flow's send ends the drain after the sends under way, not the batch.

    The drain claimed 16 intents for 4 flows; the third send raises. Each other
    flow ends the intent it holds and takes no other: the intents not started
    stay claimed for a later drain, unsent; none was sent twice.
    """
    client = make_sync_client(server.base_url, durability="normal")
    keys = [pending_via_503(client, f"exit-{i}") for i in range(40)]
    original, sends, lock = client._http.send, [0], threading.Lock()

    def send(request: httpx.Request, **kwargs: object) -> httpx.Response:
        with lock:
            sends[0] += 1
            third = sends[0] == 3
        if third:
            raise SystemExit("a transport that exits")
        time.sleep(0.02)  # the others are under way when the third raises
        return original(request)

    client._http.send = send  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        client.drain(concurrency=4)
    client._http.send = original  # type: ignore[method-assign]
    assert sends[0] <= 3 + 2 * 3  # the third, and at most two more for each other flow
    sent = [key for key in keys if len(server.requests_for(key)) > 1]  # the 503 counts one
    assert len(sent) == sends[0] - 1  # each one reached the server once; the third never did
    assert all(len(server.effects_for(key)) <= 1 for key in keys)
    # The rest, the third among them (it raised before an attempt was recorded): unsent.
    unsent = [r for r in client.outbox.list_intents() if r.attempts == 1]
    assert len(unsent) == len(keys) - len(sent)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_drain_has_at_most_concurrency_sends_in_flight(
    server: LoopbackServer, make_client: ClientFactory, concurrency: int
) -> None:
    """On PostgreSQL a drain runs one flow more than it sends; the server never sees more.

    The extra flow commits one intent's record while the next one's request is on
    the wire. It waits for a turn before it starts: without the turns the server
    would see ``concurrency + 1`` requests at once.
    """
    client = make_client(server.base_url, durability="normal")
    keys = [pending_via_503(client, f"slots-{concurrency}-{i}", delay=0.05) for i in range(8)]
    # The server is the session's: wait out any request an earlier test left sleeping.
    deadline = time.monotonic() + 10
    while server.app.state.open_now:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    server.app.state.most_open = 0
    report = client.drain(concurrency=concurrency)
    assert (report.claimed, report.succeeded, report.sent) == (8, 8, 8)
    assert server.ledger()["most_open"] == concurrency
    for key in keys:
        assert len(server.effects_for(key)) == 1


@pytest.mark.parametrize("backend", ["postgres"])  # the store whose drain runs a flow more
def test_a_flow_that_waits_for_its_turn_when_the_drain_stops_sends_nothing(
    server: LoopbackServer, make_sync_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped while it waited for the one turn to send, a claimed intent is released unsent.

    It is left as the drain found it: pending, unleased, no attempt recorded,
    and the next drain sends it.
    """
    client = make_sync_client(server.base_url)
    keys = [pending_via_503(client, f"turn-stop-{i}") for i in range(2)]
    arrived = threading.Semaphore(0)
    take = Turns.take

    def counted(self: Turns, heard: postonce._drain.Heard | None = None) -> postonce._drain.Turn:
        arrived.release()
        return take(self, heard)

    monkeypatch.setattr(Turns, "take", counted)
    stop = threading.Event()
    original = client._http.send

    def send_when_both_wait(request: httpx.Request, **kwargs: object) -> httpx.Response:
        # This flow holds the turn; the other flow has come to wait for it.
        assert arrived.acquire(timeout=10)  # its own arrival
        assert arrived.acquire(timeout=10)  # the other flow's
        stop.set()
        return original(request)

    client._http.send = send_when_both_wait  # type: ignore[method-assign]
    report = client.drain(stop=stop)
    assert (report.claimed, report.sent, report.succeeded, report.pending) == (2, 1, 1, 1)
    sends = {key: len(server.requests_for(key)) for key in keys}  # the 503 counts one
    assert sorted(sends.values()) == [1, 2]
    (unsent,) = [i for i, key in enumerate(keys) if sends[key] == 1]
    record = client.lookup(f"turn-stop-{unsent}")
    assert record is not None
    assert (record.state, record.attempts, record.lease_owner) == (State.PENDING, 1, None)
    client._http.send = original  # type: ignore[method-assign]
    assert client.drain().succeeded == 1
    assert len(server.effects_for(keys[unsent])) == 1


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_flow_that_waited_for_its_turn_checks_its_deadline_after_the_wait(
    make_client: ClientFactory,
) -> None:
    """The extra flow's wait comes before its checks: past its deadline, it never sends.

    Two intents due at once, each with a deadline 1 s away; concurrency 1. The
    client's clock moves only when the drain's first send ends, by 1.5 s: the
    first intent is sent in time, the second gets its turn after its deadline
    and is stopped unsent, not sent late. (On the wall clock, with a server
    taking 1.5 s, a slow machine could pass the first deadline too.) The send
    also takes 0.2 s of real time, so a flow checking before its wait would do
    so while the clock still reads the deadline ahead, and send. (On the async
    client the sleep blocks the event loop; there the order of the tasks is what
    puts such a check before the first send's end.)
    """
    now = [time.time()]
    sent: dict[str, int] = {}

    def first_503_then_a_slow_201(request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        sent[key] = sent.get(key, 0) + 1
        if sent[key] == 1:
            return httpx.Response(503, headers={"Retry-After": "0"})
        time.sleep(0.2)
        now[0] += 1.5
        return httpx.Response(201, json={"id": key})

    client = make_client(
        durability="normal",
        transport=httpx.MockTransport(first_503_then_a_slow_201),
        clock=lambda: now[0],
    )
    keys = []
    for i in range(2):
        with pytest.raises(postonce.IntentPending) as exc:
            client.post_once(
                "/charges",
                json={"amount": 1},
                intent=f"turn-deadline-{i}",
                retry=ONE,
                deadline=timedelta(seconds=1.0),
            )
        keys.append(exc.value.key)
    now[0] += 0.1  # past the retry's backoff (at most FAST.wait_max), within the deadline
    report = client.drain()
    # Stopped by its deadline, unsent (expired: the 503 it met left delivery ambiguous).
    assert (report.claimed, report.sent, report.succeeded, report.expired) == (2, 1, 1, 1)
    assert sorted(sent[key] for key in keys) == [1, 2]


def test_drain_flows_see_the_callers_context_variables(
    server: LoopbackServer, make_sync_client: ClientFactory
) -> None:
    """Each drain flow runs in a copy of the caller's context, in the pool's threads too."""
    tenant: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")
    client = make_sync_client(server.base_url)
    for i in range(4):
        pending_via_503(client, f"ctx-{i}")
    seen: list[tuple[str | None, str]] = []
    original = client._http.send

    def send(request: httpx.Request, **kwargs: object) -> httpx.Response:
        seen.append((tenant.get(None), threading.current_thread().name))
        return original(request)

    client._http.send = send  # type: ignore[method-assign]
    tenant.set("acme")
    assert client.drain(concurrency=3).succeeded == 4
    assert [value for value, _ in seen] == ["acme"] * 4
    assert all(name.startswith("postonce-drain") for _, name in seen)


def test_drain_concurrency_sends_every_intent_once(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """With concurrency 8, 40 due intents are each sent exactly once."""
    client = make_client(server.base_url, durability="normal")
    keys = [pending_via_503(client, f"conc-{i}") for i in range(40)]
    report = client.drain(concurrency=8)
    assert (report.claimed, report.succeeded, report.sent) == (40, 40, 40)
    ledger = server.ledger()
    for key in keys:
        assert [r["key"] for r in ledger["requests"]].count(key) == 2  # the 503, then the send
        assert len([e for e in ledger["effects"] if e["key"] == key]) == 1


# -- what the application is told is true ------------------------------------------------


def ended(
    store: postonce.Store,
    reference: str,
    state: State,
    *,
    sender: str = "s",
    origin: str = "https://api.test:443",
    owed: bool = False,
    now: float = 1000.0,
) -> None:
    """Write an intent straight into a store and end it in ``state`` (owing a settlement)."""
    from postonce._outbox.base import NewIntent

    url = f"{origin}/c"
    opened = store.open_intent(
        NewIntent(reference, f"{reference}-key-0001", True, "ietf_draft", "POST", url, (),
                  b"{}", "0" * 64, None, sender=sender, origin=origin),
        owner="o", now=now, lease_for=10.0,
    )  # fmt: skip
    assert opened.lease is not None
    settle_hold = 0.0 if owed else None
    assert store.settle(opened.lease, now=now, state=state, note="x", settle_hold=settle_hold)


def test_purge_keeps_owed_settlements_and_unresolved_intents_and_counts_the_owed(
    outbox: object,
) -> None:
    """A settlement still owed keeps its row (counted as kept_owed); expired and indeterminate
    rows are never purged; once the handler has it, the row purges as any other."""
    store = open_store(outbox)  # type: ignore[arg-type]
    try:
        ended(store, "told", State.CANCELLED)
        ended(store, "owed", State.CANCELLED, owed=True)
        ended(store, "unknown", State.INDETERMINATE)
        ended(store, "lost", State.EXPIRED)
        purged = store.purge(before=2000.0, tombstones=False, now=2000.0)
        assert (purged, getattr(purged, "kept_owed", None)) == (1, 1)
        for reference in ("owed", "unknown", "lost"):
            record = store.get(reference)
            assert record is not None
            assert (record.purged_at, record.body) == (None, b"{}"), reference
        record = store.get("owed")
        assert record is not None
        assert record.settle_due_at is not None
        assert store.settlement_done(intent_id=record.id, now=2001.0, owed_at=record.settle_due_at)
        again = store.purge(before=3000.0, tombstones=False, now=3000.0)
        assert (again, getattr(again, "kept_owed", None)) == (1, 0)
        assert store.stats(now=3000.0)["indeterminate_needing_attention"] == 1
    finally:
        store.close()


def test_census_names_whose_due_intents_a_drain_may_not_send(outbox: object) -> None:
    """The census groups the due intents of other senders and origins, most first, and counts
    this sender's settlements still owed after their handler raised."""
    from postonce._outbox.base import Foreign, NewIntent

    store = open_store(outbox)  # type: ignore[arg-type]
    mine, elsewhere = "https://api.test:443", "https://other.test:443"
    try:
        for reference, sender, origin in (
            ("a-1", "billing", mine),
            ("a-2", "billing", mine),
            ("b-1", "stripe#0123456789abcdef", mine),
            ("m-2", "me", elsewhere),
            ("m-1", "me", mine),
        ):
            store.open_intent(
                NewIntent(reference, f"{reference}-key-0001", True, "ietf_draft", "POST",
                          f"{origin}/c", (), b"{}", "0" * 64, None, sender=sender, origin=origin),
                owner="crashed/1", now=1000.0, lease_for=1.0,
            )  # fmt: skip
        ended(store, "failing", State.SUCCEEDED, sender="me", owed=True)
        record = store.get("failing")
        assert record is not None
        assert record.settle_due_at is not None
        store.settlement_failed(
            intent_id=record.id, error="E: x", retry_at=5000.0, owed_at=record.settle_due_at
        )
        census = store.census(sender="me", origins=[mine], now=1100.0)
        assert census.not_ours == 4
        # Each group says since when it waits: the first lease (of 1 s, at 1000) that ran out.
        assert census.foreign == (
            Foreign("billing", mine, 2, 1001.0),
            Foreign("me", elsewhere, 1, 1001.0),
            Foreign("stripe#0123456789abcdef", mine, 1, 1001.0),
        )
        assert census.settle_failing == 1
        assert store.census(sender="billing", origins=[mine], now=1100.0).settle_failing == 0
    finally:
        store.close()


def test_the_drain_report_names_the_outbox_and_this_client(
    make_client: ClientFactory, outbox: object
) -> None:
    """The report says which outbox was drained (an absolute path, a URL with no password) and
    as whom; another sender's due intent is named there, and leaves ``ok`` as it is."""
    from pathlib import Path

    client = make_client(name="this-service")
    other = make_client(name="billing", transport=httpx.MockTransport(connect_error))
    with pytest.raises(postonce.IntentPending):
        other.post_once("/c", json={}, intent="theirs", retry=ONE)
    time.sleep(0.06)  # FAST's waits are at most 50 ms: the intent is due
    report = client.drain()
    assert (report.sender, report.origins) == ("this-service", ("http://api.test:80",))
    if isinstance(outbox, str) and outbox.startswith("postgresql://"):
        assert report.outbox is not None
        assert report.outbox.startswith("postgresql://")
    elif isinstance(outbox, str):
        assert report.outbox == str(Path(outbox).resolve())
    else:
        assert report.outbox == "MemoryOutbox"
    assert report.not_ours == 1
    assert [(f.sender, f.origin, f.due) for f in report.foreign_senders] == [
        ("billing", "http://api.test:80", 1)
    ]
    assert report.ok


def test_a_postgres_outbox_is_named_without_its_password() -> None:
    """The report's outbox for a URL with a password (userinfo or query) shows neither."""
    from postonce._drain import outbox_name, without_password
    from tests.conftest import pg_schema

    assert (
        without_password("postgresql://app:s3cret@db.test:5432/pay?password=s3cret&sslmode=require")
        == "postgresql://app:***@db.test:5432/pay?sslmode=require"
    )
    with pg_schema() as url:
        secret = url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
        store = open_store(secret)
        try:
            named = outbox_name(store)
        finally:
            store.close()
    assert named is not None
    assert "s3cret" not in named
    assert named.startswith("postgresql://postgres:***@127.0.0.1:5432/test?schema=t_")
