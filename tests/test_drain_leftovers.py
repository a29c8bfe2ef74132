"""What a drain cannot send, and what it must not leave behind.

An intent under a profile the drain's client does not know is handed back due
later, counted and said, so a one-shot drain ends (issue 35, item 8). Rows an
older release writes with no sender after the migration are adopted on every
pass, not only when the drain opens (item 7). The census names the senders
whose due intents nobody has claimed for a while, with the call that adopts
them (item 1).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

import postonce
from postonce import State
from postonce._drain import ORPHANED_AFTER, UNSENDABLE_WAIT, foreign_message
from postonce._outbox.base import NewIntent
from postonce._outbox.locate import open_store, split_schema
from postonce.testing import MemoryOutbox
from tests.conftest import FAST, ClientFactory, OutboxUnderTest

ONE = FAST.model_copy(update={"attempts": 1})
BASE = "http://api.test"
ORIGIN = "http://api.test:80"
ACME = postonce.Provider(name="acme", key_field="X-Acme-Key", retention=86400)


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


def recording(sent: list[httpx.Request]) -> httpx.MockTransport:
    """A transport that answers 201 and keeps each request it was sent."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(201)

    return httpx.MockTransport(answer)


def drain_in_thread(client: Any, **options: Any) -> tuple[postonce.DrainReport | None, bool]:
    """Run a one-shot drain for at most 10 s: its report, and whether it ended by itself."""
    stop = threading.Event()
    done: list[postonce.DrainReport] = []
    thread = threading.Thread(target=lambda: done.append(client.drain(stop=stop, **options)))
    thread.start()
    thread.join(timeout=10)
    ended = not thread.is_alive()
    stop.set()
    thread.join(timeout=30)
    return (done[0] if done else None), ended


# -- item 8: an intent the drain cannot send ------------------------------------------


def unknown_profile_intent(outbox: OutboxUnderTest | Path, intent: str) -> None:
    """A pending intent of sender 'svc' under the custom profile 'acme' (never sent)."""
    with (
        postonce.Client(
            BASE, provider=ACME, name="svc", outbox=outbox, transport=httpx.MockTransport(refused)
        ) as writer,
        pytest.raises(postonce.IntentPending),
    ):
        writer.post_once("/c", json={"n": 1}, intent=intent, retry=ONE)


def test_an_intent_under_an_unknown_profile_is_handed_back_due_later_and_the_drain_ends(
    make_sync_client: ClientFactory, outbox: OutboxUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    """A one-shot drain whose client lacks an intent's profile hands it back due later, counts
    it as unsendable, says so once, and ends (it used to claim and release it for ever)."""
    unknown_profile_intent(outbox, "acme-charge")
    sent: list[httpx.Request] = []
    drainer = make_sync_client(name="svc", transport=recording(sent))
    time.sleep(0.06)  # FAST's waits are at most 50 ms: the intent is due
    before = time.time()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="postonce"):
        report, ended = drain_in_thread(drainer)
    assert ended, "the one-shot drain kept claiming the intent it cannot send"
    assert report is not None
    assert (report.claimed, report.unsendable, report.errors, report.sent) == (1, 1, 0, 0)
    assert not report.ok
    assert sent == []
    record = drainer.lookup("acme-charge")
    assert record is not None
    assert record.state is State.PENDING
    assert record.due_at is not None
    assert record.due_at >= before + UNSENDABLE_WAIT
    said = [r.getMessage() for r in caplog.records if "acme-charge" in r.getMessage()]
    assert len(said) == 1, said
    assert "'acme" in said[0]
    assert drainer.drain().claimed == 0  # handed back due later: not taken again at once


def test_an_async_drain_hands_back_an_intent_it_cannot_send_and_ends(outbox_path: Path) -> None:
    """AsyncClient's one-shot drain ends too, the intent handed back due later."""
    unknown_profile_intent(outbox_path, "acme-async")
    time.sleep(0.06)

    async def drain() -> postonce.DrainReport:
        async with postonce.AsyncClient(
            BASE, name="svc", outbox=outbox_path, transport=httpx.MockTransport(refused)
        ) as client:
            return await asyncio.wait_for(client.drain(), timeout=10)

    try:
        report = asyncio.run(drain())
    except TimeoutError:
        pytest.fail("the async one-shot drain kept claiming an intent it cannot send")
    assert (report.claimed, report.unsendable, report.sent) == (1, 1, 0)


def test_the_drain_command_exits_5_for_an_intent_it_cannot_send(
    monkeypatch: pytest.MonkeyPatch, outbox_path: Path
) -> None:
    """``postonce drain`` ends and exits 5 (its own status, listed in --help) when it handed
    back an intent its client cannot send."""
    from postonce import _cli

    unknown_profile_intent(outbox_path, "acme-cli")
    time.sleep(0.06)
    client = postonce.Client(
        BASE, name="svc", outbox=outbox_path, transport=httpx.MockTransport(refused)
    )
    monkeypatch.setattr(_cli, "_load_client", lambda spec: client)
    result: list[Any] = []
    thread = threading.Thread(
        target=lambda: result.append(
            CliRunner().invoke(_cli.main, ["drain", "--app", "x:y"], catch_exceptions=False)
        ),
        daemon=True,
    )
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        client.close()  # stops the drain that would not end by itself
        thread.join(timeout=30)
        pytest.fail("postonce drain kept claiming an intent it cannot send")
    (invoked,) = result
    assert invoked.exit_code == _cli.EXIT_UNSENDABLE == 5, invoked.stderr
    assert '"unsendable": 1' in invoked.stdout
    assert "exit 5" in invoked.stderr
    assert _cli.exit_status(postonce.DrainReport(unsendable=1, not_ours=1)) == 5
    assert _cli.exit_status(postonce.DrainReport(unsendable=1, settle_failed=1)) == 4
    assert _cli.exit_status(postonce.DrainReport(unsendable=1, failed=1)) == 1
    helped = CliRunner().invoke(_cli.main, ["drain", "--help"])
    assert "5  due intents of this client" in helped.output


# -- item 7: rolling upgrades -----------------------------------------------------------


def old_release_writes(outbox: OutboxUnderTest, reference: str, url: str) -> None:
    """Write an intent as a release from before sender identities does: no sender, no origin.

    A raw INSERT of the columns that release knew, into the migrated outbox.
    """
    now = time.time() - 1
    key = f"{reference}-key-0001"
    values: dict[str, object] = {
        "reference": reference,
        "key": key,
        "provider": "ietf_draft",
        "method": "POST",
        "url": url,
        "headers": "[]",
        "body": b'{"n": 1}',
        "fingerprint": "0" * 64,
        "state": "pending",
        "created_at": now,
        "updated_at": now,
        "due_at": now,
        "attempts": 0,
    }
    if isinstance(outbox, MemoryOutbox):
        store = open_store(outbox)
        store.open_intent(
            NewIntent(reference, key, True, "ietf_draft", "POST", url, (), b'{"n": 1}', "0" * 64,
                      None),
            owner="old-release/1", now=now - 60, lease_for=1.0,
        )  # fmt: skip
        return
    columns = ", ".join(values)
    if outbox.startswith("postgresql://"):
        pg_url, schema = split_schema(outbox)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("INSERT INTO {}.intents ({}) VALUES ({})").format(
                    sql.Identifier(schema),
                    sql.SQL(columns),
                    sql.SQL(", ".join("%s" for _ in values)),
                ),
                tuple(values.values()),
            )
        return
    marks = ", ".join("?" for _ in values)
    insert = f"INSERT INTO intents ({columns}) VALUES ({marks})"  # this test's own
    with sqlite3.connect(outbox) as db:
        db.execute(insert, tuple(values.values()))
    db.close()


def test_rows_of_no_sender_written_after_the_drain_opened_are_sent_by_its_next_pass(
    make_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """A row an older release writes (no sender) after a drain opened the outbox is adopted
    and sent by that client's next pass, not left until some process restarts."""
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(201, json={"ok": True})

    client = make_client(name="svc", transport=httpx.MockTransport(answer))
    assert client.drain().claimed == 0  # opened, and adopted what there was: nothing
    old_release_writes(outbox, "old-1", f"{BASE}/v1/charges")
    old_release_writes(outbox, "elsewhere-1", "http://other.test/v1/charges")
    report = client.drain()
    assert (report.claimed, report.succeeded) == (1, 1), report
    assert sent == ["/v1/charges"]
    record = client.lookup("old-1")
    assert record is not None
    assert (record.state, record.sender) == (State.SUCCEEDED, "svc")
    # The other origin's row is nobody's yet: named as unowned, not as another sender's.
    assert report.not_ours == 1
    (left,) = report.foreign_senders
    assert (left.sender, left.origin) == (None, "http://other.test:80")
    text = foreign_message(report)
    assert "unowned" in text
    assert "client.adopt(" not in text


def test_the_census_counts_rows_of_no_sender_to_its_origins_as_unowned(
    outbox: OutboxUnderTest,
) -> None:
    """A due row of no sender addressed to the drain's origins is ``unowned`` (its next pass
    adopts it), not another sender's; one to another origin is another's, of no sender."""
    store = open_store(outbox)
    try:
        left_by(store, "to-me", None, ORIGIN, 1000.0)
        left_by(store, "to-them", None, "http://other.test:80", 1000.0)
        census = store.census(sender="svc", origins=[ORIGIN], now=2000.0)
    finally:
        store.close()
    assert (census.unowned, census.not_ours) == (1, 1)
    assert [(f.sender, f.origin, f.due) for f in census.foreign] == [
        (None, "http://other.test:80", 1)
    ]


def test_a_forever_drain_adopts_rows_of_no_sender_on_every_pass(
    make_sync_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """A drain running with forever=True sends a sender-less row written while it runs."""
    done = threading.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        done.set()
        return httpx.Response(201)

    client = make_sync_client(name="svc", transport=httpx.MockTransport(answer))
    stop = threading.Event()
    thread = threading.Thread(target=lambda: client.drain(forever=True, interval=0.05, stop=stop))
    thread.start()
    try:
        time.sleep(0.3)  # the drain has opened the outbox and made passes
        old_release_writes(outbox, "old-forever", f"{BASE}/v1/charges")
        assert done.wait(10), "the running drain never took the row of no sender"
    finally:
        stop.set()
        thread.join(timeout=30)
    record = client.lookup("old-forever")
    assert record is not None
    assert record.sender == "svc"


# -- item 1: orphaned senders ---------------------------------------------------------------


def left_by(store: Any, reference: str, sender: str | None, origin: str, at: float) -> None:
    """A due intent of ``sender`` whose sending process died at ``at`` (its lease ran out)."""
    store.open_intent(
        NewIntent(reference, f"{reference}-key-0001", True, "ietf_draft", "POST",
                  f"{origin}/c", (), b"{}", "0" * 64, None, sender=sender, origin=origin),
        owner="gone/1", now=at, lease_for=1.0,
    )  # fmt: skip


def test_the_census_names_orphaned_senders_and_the_call_that_adopts_them(
    make_client: ClientFactory, outbox: OutboxUnderTest
) -> None:
    """Due intents of another sender that nobody has claimed for ORPHANED_AFTER seconds are
    named as orphaned, with ``client.adopt(...)`` and ``postonce drain --adopt``; a sender
    whose intents fell due just now is only another client's."""
    now = time.time()
    store = open_store(outbox)
    try:
        left_by(store, "old-token", "svc#0123456789abcdef", ORIGIN, now - ORPHANED_AFTER - 60)
        left_by(store, "busy", "billing", ORIGIN, now - 5)
        left_by(store, "far", "gone-elsewhere", "http://other.test:80", now - 2 * ORPHANED_AFTER)
    finally:
        store.close()  # (a MemoryOutbox keeps its rows)
    client = make_client(name="svc")
    report = client.drain()
    assert report.not_ours == 3
    orphaned = {f.sender: f.orphaned for f in report.foreign_senders}
    assert orphaned == {
        "svc#0123456789abcdef": True,
        "billing": False,
        "gone-elsewhere": False,  # not to this client's origins: adopting cannot move it here
    }
    (old,) = [f for f in report.foreign_senders if f.sender == "svc#0123456789abcdef"]
    assert old.waiting_since is not None
    assert old.waiting_since <= now - ORPHANED_AFTER
    text = foreign_message(report)
    assert "orphaned" in text
    assert "client.adopt('svc#0123456789abcdef')" in text
    assert "--adopt 'svc#0123456789abcdef'" in text
    assert "client.adopt('billing')" not in text
    assert client.adopt("svc#0123456789abcdef") == 1
    after = client.drain()
    assert after.claimed == 1
    assert [f.sender for f in after.foreign_senders if f.orphaned] == []


@pytest.mark.parametrize("kind", [postonce.Client, postonce.AsyncClient])
def test_the_drain_command_adopts_a_sender_before_it_drains(
    monkeypatch: pytest.MonkeyPatch, outbox_path: Path, kind: type[Any]
) -> None:
    """``postonce drain --adopt SENDER`` makes that sender's intents to the client's origins
    its own, says how many, and drains them."""
    from postonce import _cli

    store = open_store(outbox_path)
    try:
        left_by(store, "rotated", "svc-old", ORIGIN, time.time() - ORPHANED_AFTER - 60)
    finally:
        store.close()
    client = kind(
        BASE, name="svc", outbox=outbox_path, transport=httpx.MockTransport(
            lambda r: httpx.Response(201))
    )  # fmt: skip
    monkeypatch.setattr(_cli, "_load_client", lambda spec: client)
    invoked = CliRunner().invoke(
        _cli.main, ["drain", "--app", "x:y", "--adopt", "svc-old"], catch_exceptions=False
    )
    assert invoked.exit_code == 0, invoked.stderr
    assert '"succeeded": 1' in invoked.stdout
    assert "adopted 1 intent(s) of sender 'svc-old'" in invoked.stderr
