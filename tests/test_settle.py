"""Outcomes reach the application: meta=, settlement handlers, wait(), reconciliation.

Every test runs on SQLite, PostgreSQL and the memory outbox, with Client and
AsyncClient (the ``make_client`` fixture), against the real loopback server
where a real answer matters.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

import postonce
from postonce import Resolution, Settlement, State
from tests.conftest import FAST, ClientFactory, LoopbackServer, loopback_intent

ONE = FAST.model_copy(update={"attempts": 1})
SHORT = postonce.Provider(name="short", retention=timedelta(seconds=0.3))


class Ledger:
    """A settlement handler that records every call (the application's own side)."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[Settlement] = []
        self.fail = fail

    def __call__(self, settlement: Settlement) -> None:
        self.calls.append(settlement)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("the orders database is down")

    def states(self) -> list[tuple[str, State]]:
        return [(s.intent, s.state) for s in self.calls]


def test_meta_is_kept_returned_and_not_part_of_the_request(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """meta= is stored with the intent, given back, never sent, never fingerprinted."""
    client = make_client(server.base_url)
    body = {"amount": 1}
    first = client.post_once("/ietf/v1/charges", json=body, intent="m-1", meta={"order": "N1"})
    again = client.post_once("/ietf/v1/charges", json=body, intent="m-1", meta={"order": "N2"})
    assert again.extensions["postonce"].from_outbox  # another meta is not another request
    record = client.lookup("m-1")
    assert record is not None
    assert record.meta == {"order": "N1"}  # the first call's meta is kept
    key = first.extensions["postonce"].key
    assert "N1" not in json.dumps(server.requests_for(key))
    assert [row["meta"] for row in client.outbox.export_rows()] == [{"order": "N1"}]


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        pytest.param({"when": object()}, "JSON-serialisable", id="not-json"),
        pytest.param({"blob": "x" * 9000}, "at most 8192", id="too-big"),
        pytest.param({"n": float("nan")}, "JSON-serialisable", id="nan"),
    ],
)
def test_bad_meta_is_refused_before_anything_is_stored(
    make_client: ClientFactory, meta: Any, match: str
) -> None:
    """A typed error naming the intent; no row, nothing sent."""
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201)

    client = make_client(transport=httpx.MockTransport(handler))
    with pytest.raises(postonce.InvalidRequest, match=match) as info:
        client.post_once("/c", json={}, intent="bad-meta", meta=meta)
    assert info.value.intent == "bad-meta"
    assert client.lookup("bad-meta") is None
    assert sent == []


def test_the_handler_runs_once_before_post_once_returns(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """Succeeded or failed, the handler sees the answer and the meta; then it is delivered."""
    ledger = Ledger()
    client = make_client(server.base_url, on_settled=ledger)
    ok = client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="s-ok", meta={"o": 1})
    assert ledger.states() == [("s-ok", State.SUCCEEDED)]
    assert ledger.calls[0].meta == {"o": 1}
    assert ledger.calls[0].response is not None
    assert ledger.calls[0].response.json()["id"] == ok.json()["id"]
    declined = {"amount": 1, "_test": {"status": 402}}
    client.post_once("/ietf/v1/charges", json=declined, intent="s-402")
    assert ledger.states()[-1] == ("s-402", State.FAILED)
    for reference in ("s-ok", "s-402"):
        record = client.lookup(reference)
        assert record is not None
        assert (record.settle_due_at, record.settled_at is not None) == (None, True)
    client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="s-ok")  # from the outbox
    assert len(ledger.calls) == 2  # a replay from the outbox settles nothing again


def test_a_failing_handler_never_changes_the_outcome_and_is_retried_by_the_drain(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The call still returns its answer; the drain calls the handler again until it returns."""
    ledger = Ledger(fail=1)
    client = make_client(server.base_url, on_settled=ledger)
    with postonce.testing.set_testing():  # no backoff: the drain may retry at once
        response = client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="f-1")
        assert response.status_code == 201
        record = client.lookup("f-1")
        assert record is not None
        assert (record.state, record.settle_attempts) == (State.SUCCEEDED, 1)
        assert record.settle_error == "RuntimeError: the orders database is down"
        report = client.drain()
    assert report.settled == 1
    assert ledger.states() == [("f-1", State.SUCCEEDED)] * 2
    record = client.lookup("f-1")
    assert record is not None
    assert record.settled_at is not None


def test_an_intent_the_drain_finishes_is_settled_by_the_drain(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The outage story: the call gives up (IntentPending), the drain charges and settles."""
    ledger = Ledger()
    client = make_client(server.base_url, on_settled=ledger)
    outage = {"amount": 1, "_test": {"before": [{"status": 503}]}}
    with pytest.raises(postonce.IntentPending):
        client.post_once("/ietf/v1/charges", json=outage, intent="o-1", retry=ONE, meta={"o": 7})
    assert ledger.calls == []
    record = client.lookup("o-1")
    assert record is not None
    assert record.due_at is not None
    time.sleep(max(0.0, record.due_at - time.time()))
    report = client.drain()
    assert (report.succeeded, report.settled) == (1, 1)
    assert ledger.states() == [("o-1", State.SUCCEEDED)]
    assert ledger.calls[0].meta == {"o": 7}


def test_wait_returns_the_answer_once_another_worker_finishes(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """wait() blocks until any worker on the outbox ends the intent; a timeout is IntentPending."""
    client = make_client(server.base_url)
    outage = {"amount": 1, "_test": {"before": [{"status": 503}]}}
    with pytest.raises(postonce.IntentPending):
        client.post_once("/ietf/v1/charges", json=outage, intent="w-1", retry=ONE)
    with pytest.raises(postonce.IntentPending):
        client.wait("w-1", timeout=0.2)
    worker = make_client(server.base_url)
    finisher = threading.Timer(0.3, worker.drain)
    finisher.start()
    try:
        response = client.wait("w-1", timeout=30)
    finally:
        finisher.join()
    assert response.status_code == 201
    assert response.extensions["postonce"].from_outbox
    with pytest.raises(KeyError):
        client.wait("nobody", timeout=0.1)


def expired_intent(make_client: ClientFactory, reference: str, **options: Any) -> Any:
    """An intent whose delivery was ambiguous past a 0.3 s retention: expired by the drain."""

    def lost(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("lost", request=request)

    client = make_client(provider=SHORT, transport=httpx.MockTransport(lost), **options)
    with pytest.raises(postonce.IntentPending):
        client.post_once("/c", json={}, intent=reference, retry=ONE, meta={"order": reference})
    time.sleep(0.35)
    return client


def test_the_reconciler_resolves_expired_intents_and_the_handler_follows(
    make_client: ClientFactory,
) -> None:
    """A drain asks reconcile(); its answer is recorded as a resolve would be, then settled."""
    asked: list[postonce.IntentRecord] = []
    ledger = Ledger()

    def reconcile(intent: postonce.IntentRecord) -> Resolution | None:
        asked.append(intent)
        return Resolution.succeeded(note=f"ch_for_{intent.meta['order']}")

    client = expired_intent(make_client, "r-1", on_settled=ledger, reconcile=reconcile)
    report = client.drain()
    assert (report.expired, report.reconciled) == (1, 1)
    assert [a.reference for a in asked] == ["r-1"]
    record = client.lookup("r-1")
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert record.note == f"reconciled by {client.sender}: ch_for_r-1"
    # With a reconciler, the handler hears once: of the resolution, not of the expiry first.
    assert ledger.states() == [("r-1", State.SUCCEEDED)]
    with pytest.raises(postonce.IntentResolved):
        client.post_once("/c", json={}, intent="r-1")


def test_a_reconciler_that_cannot_tell_is_asked_again_only_after_its_interval(
    make_client: ClientFactory,
) -> None:
    """None leaves the intent expired for a person; the next drain does not ask at once."""
    asked: list[str] = []

    def reconcile(intent: postonce.IntentRecord) -> Resolution | None:
        asked.append(intent.reference)
        return None

    client = expired_intent(make_client, "r-2", reconcile=reconcile, reconcile_every=3600)
    client.drain()
    client.drain()
    assert asked == ["r-2"]
    record = client.lookup("r-2")
    assert record is not None
    assert record.state is State.EXPIRED


def test_resolve_and_cancel_through_a_client_run_its_handler(make_client: ClientFactory) -> None:
    """An operator's move made with the application's client settles like any other ending."""
    ledger = Ledger()
    client = expired_intent(make_client, "r-3", on_settled=ledger)
    client.drain()
    ledger.calls.clear()
    moved = client.resolve("r-3", State.FAILED, note="no charge at the provider")
    assert moved.state is State.FAILED
    assert ledger.states() == [("r-3", State.FAILED)]
    assert ledger.calls[0].note == "no charge at the provider"


def test_client_refuses_an_async_settlement_handler(tmp_path: Path) -> None:
    """Client calls handlers without awaiting: an async one is refused when it is built."""

    async def handler(settlement: Settlement) -> None:
        return None

    with pytest.raises(postonce.ConfigurationError, match="on_settled"):
        postonce.Client("http://api.test", outbox=tmp_path / "o.sqlite3", on_settled=handler)


def test_async_client_awaits_an_async_handler(server: LoopbackServer, tmp_path: Path) -> None:
    """AsyncClient awaits a coroutine handler before the call returns."""
    import anyio

    seen: list[State] = []

    async def handler(settlement: Settlement) -> None:
        await anyio.sleep(0)
        seen.append(settlement.state)

    async def main() -> None:
        async with postonce.AsyncClient(
            server.base_url, outbox=tmp_path / "o.sqlite3", on_settled=handler
        ) as client:
            await client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="a-1")
            assert seen == [State.SUCCEEDED]
            assert (await client.wait("a-1", timeout=1)).status_code == 201

    anyio.run(main)


def test_cli_resolve_with_app_runs_the_handler_and_shows_the_settlement(
    server: LoopbackServer, tmp_path: Path
) -> None:
    """postonce outbox resolve --app: the move goes through the client, its handler runs."""
    import os
    import subprocess
    import sys

    outbox, ledger = tmp_path / "o.sqlite3", tmp_path / "ledger.txt"
    store = postonce.SQLiteStore(outbox)
    opened = store.open_intent(
        loopback_intent(
            server,
            "cli-r",
            sender="settle-crash",
            body=b"{}",
            headers=(),
            meta='{"order_id": "N7"}',
        ),
        owner="x",
        now=time.time(),
        lease_for=10,
    )
    assert opened.lease is not None
    store.settle(opened.lease, now=time.time(), state=State.EXPIRED, note="past the horizon")
    store.close()
    env = {
        **os.environ,
        "POSTONCE_TEST_BASE_URL": server.base_url,
        "POSTONCE_TEST_OUTBOX": str(outbox),
        "POSTONCE_TEST_SETTLE_LEDGER": str(ledger),
    }
    root = Path(__file__).resolve().parent.parent

    def cli(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "postonce", "outbox", "--outbox", str(outbox), *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    cli(
        "resolve",
        "cli-r",
        "--succeeded",
        "--note",
        "ch_9 found",
        "--app",
        "tests.settle_app:client",
    )
    assert ledger.read_text().split() == ["done", "cli-r", "succeeded"]
    shown = json.loads(cli("show", "cli-r", "--json"))
    assert shown["meta"] == {"order_id": "N7"}
    assert shown["settlement"].startswith("delivered ")
    stats = json.loads(cli("stats", "--json"))
    assert (stats["settlements_owed"], stats["settlements_failing"]) == (0, 0)


def test_another_senders_intent_is_neither_settled_waited_on_nor_resolved_here(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """A shared outbox: this client's handler, wait() and resolve() stay with its own intents."""
    theirs, mine = Ledger(), Ledger()
    other = make_client(server.base_url, name="other-service", on_settled=theirs)
    client = make_client(server.base_url, name="this-service", on_settled=mine)
    other.post_once("/ietf/v1/charges", json={"amount": 1}, intent="shared/charge")
    with pytest.raises(postonce.IntentConflict, match="other-service"):
        client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="shared/charge")
    with pytest.raises(KeyError):
        client.wait("shared/charge", timeout=0.1)
    with pytest.raises(postonce.IntentConflict, match="other-service"):
        client.resolve("shared/charge", State.FAILED, note="not mine")
    assert theirs.states() == [("shared/charge", State.SUCCEEDED)]
    assert mine.calls == []


# -- found by review: each of these failed before its fix ---------------------------------


def test_a_late_handler_result_never_clears_a_newer_settlement(outbox: Any) -> None:
    """A drain's handler still running on the expiry; an operator resolves meanwhile.

    The late ``done`` presents the old settlement's fence and is refused: the
    resolution's settlement stays owed and is delivered next.
    """
    from postonce._outbox.base import NewIntent
    from postonce._outbox.locate import open_store

    store = open_store(outbox)
    opened = store.open_intent(
        NewIntent("e1", "e1-key-0001", True, "ietf_draft", "POST", "https://api.test/c", (),
                  b"{}", "0" * 64, None, sender="s", origin="https://api.test:443"),
        owner="o", now=1000.0, lease_for=10.0,
    )  # fmt: skip
    assert opened.lease is not None
    store.settle(opened.lease, now=1001.0, state=State.EXPIRED, note="x", settle_hold=0.0)
    (held,) = store.claim_settlements(sender="s", now=1002.0, limit=10, hold=60.0)
    assert held.settle_due_at == 1062.0
    resolved = store.operator_move("e1", State.SUCCEEDED, now=1003.0, note="ok", settle_hold=0.0)
    assert resolved.settle_due_at == 1003.0
    assert not store.settlement_done(intent_id=held.id, now=1004.0, owed_at=1062.0)
    record = store.get("e1")
    assert record is not None
    assert (record.state, record.settle_due_at, record.settled_at) == (
        State.SUCCEEDED,
        1003.0,
        None,
    )
    (again,) = store.claim_settlements(sender="s", now=1005.0, limit=10, hold=60.0)
    assert again.state is State.SUCCEEDED
    if not isinstance(outbox, postonce.testing.MemoryOutbox):
        store.close()


def test_settlements_are_claimed_only_for_the_clients_origins(outbox: Any) -> None:
    """One sender, two origins: a drain settles only the intents addressed to its own."""
    from postonce._outbox.base import NewIntent
    from postonce._outbox.locate import open_store

    store = open_store(outbox)
    for ref, origin in (("p1", "https://pal.test:443"), ("c1", "https://checkout.test:443")):
        opened = store.open_intent(
            NewIntent(ref, f"{ref}-key-0001", True, "ietf_draft", "POST", f"{origin}/c", (),
                      b"{}", "0" * 64, None, sender="same", origin=origin),
            owner="o", now=1000.0, lease_for=10.0,
        )  # fmt: skip
        assert opened.lease is not None
        store.settle(opened.lease, now=1001.0, state=State.CANCELLED, note="x", settle_hold=0.0)
    mine = store.claim_settlements(
        sender="same", now=1002.0, limit=10, hold=60.0, origins=["https://pal.test:443"]
    )
    assert [r.reference for r in mine] == ["p1"]
    if not isinstance(outbox, postonce.testing.MemoryOutbox):
        store.close()


def test_a_reconciler_answer_for_an_intent_resolved_meanwhile_does_not_stop_the_drain(
    make_client: ClientFactory,
) -> None:
    """Someone resolved it between the claim and the answer: theirs stands, the drain goes on."""
    client: Any = None

    def reconcile(intent: postonce.IntentRecord) -> Resolution | None:
        client.outbox.operator_move(intent.reference, State.FAILED, now=time.time(), note="ops")
        return Resolution.succeeded(note="too late")

    client = expired_intent(make_client, "r-9", reconcile=reconcile)
    report = client.drain()
    assert report.reconciled == 0
    record = client.lookup("r-9")
    assert record is not None
    assert (record.state, record.note) == (State.FAILED, "ops")


def test_a_replay_while_the_handler_runs_does_not_call_it_again(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """The answer read from the outbox is not a new ending: one handler call, not two."""
    calls: list[str] = []
    started = threading.Event()

    def slow(settlement: Settlement) -> None:
        calls.append(threading.current_thread().name)
        started.set()
        time.sleep(0.3)

    client = make_client(server.base_url, on_settled=slow)
    first = threading.Thread(
        target=lambda: client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="rp"),
        name="first",
    )
    first.start()
    assert started.wait(10)
    again = client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="rp")
    first.join()
    assert again.extensions["postonce"].from_outbox
    assert len(calls) == 1


# -- a reconciler's answer is checked; one failure is counted, never fatal ----------------


def test_resolution_takes_a_state_or_its_value_and_refuses_anything_else() -> None:
    """Resolution("succeeded") is State.SUCCEEDED; any other state or type is refused at once."""
    assert Resolution("succeeded").state is State.SUCCEEDED  # type: ignore[arg-type]
    assert Resolution("failed", "none at the provider").state is State.FAILED  # type: ignore[arg-type]
    assert Resolution(State.SUCCEEDED, None).note == ""  # type: ignore[arg-type]
    for bad in ("expired", "indeterminate", State.CANCELLED, "SUCCEEDED", "ok", True, 1, None):
        with pytest.raises(postonce.ConfigurationError, match=r"State\.SUCCEEDED or State\.FAILED"):
            Resolution(bad)  # type: ignore[arg-type]
    with pytest.raises(postonce.ConfigurationError, match="note is text"):
        Resolution.succeeded(note=42)  # type: ignore[arg-type]


def test_a_reconciler_answering_a_state_value_resolves_the_intent(
    make_client: ClientFactory,
) -> None:
    """A reconciler that returns Resolution("succeeded") resolves it (it crashed the drain)."""

    def reconcile(intent: postonce.IntentRecord) -> Resolution:
        return Resolution("succeeded", "ch_1")  # type: ignore[arg-type]

    client = expired_intent(make_client, "v-1", reconcile=reconcile)
    report = client.drain()
    assert (report.reconciled, report.reconcile_failed) == (1, 0)
    record = client.lookup("v-1")
    assert record is not None
    assert record.state is State.SUCCEEDED


def test_a_reconciler_answering_no_resolution_is_logged_skipped_and_counted(
    make_client: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong type is logged and counted; the intent stays expired; the drain ends normally."""

    def reconcile(intent: postonce.IntentRecord) -> Any:
        return "succeeded"

    client = expired_intent(make_client, "v-2", reconcile=reconcile)
    report = client.drain()
    assert (report.reconciled, report.reconcile_failed) == (0, 1)
    assert not report.ok
    record = client.lookup("v-2")
    assert record is not None
    assert record.state is State.EXPIRED
    assert "it must return a postonce.Resolution" in caplog.text


def two_expired(factory: Any, **options: Any) -> Any:
    """One client, two intents (x-1, x-2) expired by its first drain."""

    def lost(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("lost", request=request)

    client = factory(provider=SHORT, transport=httpx.MockTransport(lost), **options)
    for reference in ("x-1", "x-2"):
        with pytest.raises(postonce.IntentPending):
            client.post_once("/c", json={}, intent=reference, retry=ONE)
    time.sleep(0.35)
    return client


def test_one_failing_reconciliation_does_not_keep_the_others_from_theirs(
    make_client: ClientFactory,
) -> None:
    """A reconciler that raises for one intent: logged and counted; the other is resolved."""

    def reconcile(intent: postonce.IntentRecord) -> Resolution:
        if intent.reference == "x-1":
            raise RuntimeError("the provider's search API is down")
        return Resolution.failed("no charge")

    client = two_expired(make_client, reconcile=reconcile)
    report = client.drain()
    assert (report.expired, report.reconciled, report.reconcile_failed) == (2, 1, 1)
    states = {ref: client.lookup(ref).state for ref in ("x-1", "x-2")}
    assert states == {"x-1": State.EXPIRED, "x-2": State.FAILED}


class FlakyOutbox(postonce.testing.MemoryOutbox):
    """A memory outbox that fails to record x-1's resolution and x-2's first settlement."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_done = 1

    def operator_move(self, reference: str, to: State, **kwargs: Any) -> postonce.IntentRecord:
        if reference == "x-1":
            raise postonce.OutboxError("the database went away")
        return super().operator_move(reference, to, **kwargs)

    def settlement_done(self, **kwargs: Any) -> bool:
        if self.fail_done:
            self.fail_done -= 1
            raise postonce.OutboxError("the database went away")
        return super().settlement_done(**kwargs)


def test_a_store_error_recording_a_resolution_or_a_settlement_is_counted_and_skipped(
    client_kind: str,
) -> None:
    """The outbox fails to record one resolution and one settlement: both are logged and
    counted, the drain goes on and returns its report."""
    from tests.conftest import _factory

    made: list[Any] = []
    ledger = Ledger()
    try:
        client = two_expired(
            _factory(FlakyOutbox(), client_kind, made),
            reconcile=lambda intent: Resolution.succeeded("found"),
            on_settled=ledger,
        )
        report = client.drain()
        assert (report.reconciled, report.reconcile_failed) == (1, 1)
        assert (report.settled, report.settle_failed) == (0, 1)
        assert ledger.states() == [("x-2", State.SUCCEEDED)]  # called; its record failed
        assert client.lookup("x-1").state is State.EXPIRED
    finally:
        for each in made:
            each.close()


def test_a_settlement_handler_that_keeps_failing_is_counted_and_reported_owed(
    server: LoopbackServer, make_client: ClientFactory
) -> None:
    """A handler that raises in the drain too: counted, still owed, and the report not ok."""
    ledger = Ledger(fail=2)
    client = make_client(server.base_url, on_settled=ledger)
    with postonce.testing.set_testing():  # no backoff: the drain calls it again at once
        client.post_once("/ietf/v1/charges", json={"amount": 1}, intent="k-1")
        report = client.drain()
    assert (report.settled, report.settle_failed, report.settle_failing) == (0, 1, 1)
    assert not report.ok
    assert len(ledger.calls) == 2


def test_a_forever_worker_outlives_failing_handlers_and_reconcilers(tmp_path: Path) -> None:
    """--forever: a reconciler and a handler that always raise are counted pass after pass;
    the worker runs until it is stopped and returns its report."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/ok":
            return httpx.Response(201)
        raise httpx.ReadTimeout("lost", request=request)

    def reconcile(intent: postonce.IntentRecord) -> Resolution:
        raise RuntimeError("the provider's search API is down")

    handler = Ledger(fail=10**6)
    client = postonce.Client(
        "http://api.test",
        outbox=tmp_path / "o.sqlite3",
        provider=SHORT,
        retry=ONE,
        transport=httpx.MockTransport(answer),
        reconcile=reconcile,
        reconcile_every=0.01,
        on_settled=handler,
    )
    with client, postonce.testing.set_testing():  # no backoff: each pass calls the handler
        client.post_once("/ok", json={}, intent="w-ok")
        with pytest.raises(postonce.IntentPending):
            client.post_once("/c", json={}, intent="w-lost")
        time.sleep(0.35)
        stop = threading.Event()
        threading.Timer(1.0, stop.set).start()
        report = client.drain(forever=True, interval=0.02, stop=stop)
    assert report.expired == 1
    assert report.reconcile_failed >= 2  # asked again pass after pass, never fatal
    assert report.settle_failed >= 2
    assert len(handler.calls) == report.settle_failed + 1  # the foreground's call, then each pass
    assert report.settle_failing == 1
    assert not report.ok
