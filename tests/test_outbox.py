"""The SQLite outbox: schema, durability, permissions, claims and fencing."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path

import httpx
import pytest

import postonce
from postonce import SQLiteStore, State
from postonce._intent import Outcome
from postonce._outbox.base import AttemptRecord, NewIntent
from postonce._outbox.sqlite import SCHEMA_VERSION
from tests.conftest import ClientFactory


def new_intent(reference: str = "r-1", key: str = "k-0000-1", body: bytes = b"{}") -> NewIntent:
    return NewIntent(
        reference=reference,
        key=key,
        key_given=False,
        provider="ietf_draft",
        method="POST",
        url="http://api.test/c",
        headers=(("content-type", "application/json"),),
        body=body,
        fingerprint="f" * 64,
        deadline_at=None,
    )


def an_attempt(outcome: Outcome = Outcome.FINAL, status: int | None = 201) -> AttemptRecord:
    return AttemptRecord(1000.0, 0.1, outcome, status, None, False)


def test_schema_is_created_with_its_version(outbox_path: Path) -> None:
    """A new outbox has the current schema version, WAL mode and both tables."""
    SQLiteStore(outbox_path).close()
    conn = sqlite3.connect(outbox_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"intents", "attempts"} <= tables
    conn.close()


def test_reopening_keeps_the_data(outbox_path: Path) -> None:
    """Opening an existing outbox does not migrate it again or lose rows."""
    store = SQLiteStore(outbox_path)
    store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
    store.close()
    again = SQLiteStore(outbox_path)
    record = again.get("r-1")
    assert record is not None
    assert record.key == "k-0000-1"
    again.close()


def test_a_newer_schema_is_refused(outbox_path: Path) -> None:
    """An outbox written by a newer postonce is refused with a message saying so."""
    SQLiteStore(outbox_path).close()
    conn = sqlite3.connect(outbox_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(postonce.OutboxError, match="newer postonce"):
        SQLiteStore(outbox_path)


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        pytest.param("SELECT * FROM intents WHERE reference = 'x'", "intents_reference", id="ref"),
        pytest.param(
            "SELECT id FROM intents WHERE state = 'pending' AND due_at <= 5 ORDER BY due_at",
            "intents_due",
            id="due",
        ),
    ],
)
def test_lookups_use_an_index(outbox_path: Path, sql: str, index: str) -> None:
    """Lookup by reference and the due-time scan are index searches, not table scans."""
    SQLiteStore(outbox_path).close()
    conn = sqlite3.connect(outbox_path)
    plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql))
    conn.close()
    assert index in plan
    assert "SCAN intents" not in plan


def test_default_outbox_is_private_and_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default outbox lives under the user data dir: file 0600 in a 0700 directory."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("POSTONCE_OUTBOX", raising=False)
    path = postonce.default_outbox_path()
    assert path.is_relative_to(tmp_path / "data")
    client = postonce.Client(
        "http://api.test", transport=httpx.MockTransport(lambda r: httpx.Response(201))
    )
    client.post_once("/c", json={}, intent="perm")
    client.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_outbox_env_var_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """POSTONCE_OUTBOX chooses the outbox when outbox= is not given."""
    target = tmp_path / "env-outbox.db"
    monkeypatch.setenv("POSTONCE_OUTBOX", f"sqlite:///{target}")
    client = postonce.Client(
        "http://api.test", transport=httpx.MockTransport(lambda r: httpx.Response(201))
    )
    client.post_once("/c", json={}, intent="env")
    client.close()
    assert SQLiteStore(target).get("env") is not None


def test_two_connections_can_create_one_new_outbox_at_once(tmp_path: Path) -> None:
    """Two threads opening the same brand-new outbox together both succeed (WAL switch race)."""
    errors: list[BaseException] = []
    for round_ in range(100):
        path = tmp_path / f"new-{round_}.sqlite3"
        barrier = threading.Barrier(2)

        def open_it(path: Path = path, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                SQLiteStore(path).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_concurrent_opens_grant_one_lease(outbox_path: Path) -> None:
    """Many threads on separate connections race for one intent: exactly one holds it."""
    SQLiteStore(outbox_path).close()
    barrier = threading.Barrier(8)
    leases: list[bool] = []

    def race(i: int) -> None:
        store = SQLiteStore(outbox_path)
        barrier.wait()
        opened = store.open_intent(new_intent(), owner=f"w{i}", now=1000.0, lease_for=60)
        leases.append(opened.lease is not None)
        store.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(leases) == [False] * 7 + [True]


def test_expired_lease_is_taken_over_and_the_old_owner_is_fenced(outbox_path: Path) -> None:
    """After a lease expires another owner claims it; the old owner's writes are refused."""
    a, b = SQLiteStore(outbox_path), SQLiteStore(outbox_path)
    first = a.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
    assert first.lease is not None
    early = b.open_intent(new_intent(), owner="b", now=1005.0, lease_for=10)
    assert early.lease is None
    late = b.open_intent(new_intent(), owner="b", now=1011.0, lease_for=10)
    assert late.lease is not None
    assert late.record.key == first.record.key
    assert late.anchor_before == 1000.0
    stale = a.record(
        first.lease,
        an_attempt(),
        state=State.SUCCEEDED,
        anchor=1000.0,
        due_at=None,
        lease_until=None,
        response=None,
        note=None,
        durable=True,
    )
    assert stale is False
    assert a.release(first.lease, now=1012.0, due_at=None, anchor=None) is False
    assert a.settle(first.lease, now=1012.0, state=State.EXPIRED, note="x") is False
    assert a.renew(first.lease, now=1012.0, until=2000.0) is None
    record = b.get("r-1")
    assert record is not None
    assert record.state is State.SENDING
    assert record.lease_owner == "b"
    assert b.record(
        late.lease,
        an_attempt(),
        state=State.SUCCEEDED,
        anchor=1000.0,
        due_at=None,
        lease_until=None,
        response=None,
        note=None,
        durable=True,
    )
    a.close()
    b.close()


def test_terminal_intents_are_not_claimed(outbox_path: Path) -> None:
    """open_intent on a terminal intent returns it without a lease."""
    store = SQLiteStore(outbox_path)
    opened = store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
    assert opened.lease is not None
    store.record(
        opened.lease,
        an_attempt(),
        state=State.SUCCEEDED,
        anchor=1000.0,
        due_at=None,
        lease_until=None,
        response=None,
        note=None,
        durable=True,
    )
    again = store.open_intent(new_intent(), owner="b", now=2000.0, lease_for=10)
    assert again.lease is None
    assert again.record.state is State.SUCCEEDED
    store.close()


def test_write_ahead_is_full_sync_and_a_2xx_record_is_not(outbox_path: Path) -> None:
    """One fsync per intent: the write-ahead commits with FULL, a 2xx completion with NORMAL."""
    store = SQLiteStore(outbox_path)
    trace: list[str] = []
    store._conn.set_trace_callback(trace.append)
    opened = store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
    assert opened.lease is not None
    write_ahead = trace[: trace.index("COMMIT") + 1]
    trace.clear()
    store.record(
        opened.lease,
        an_attempt(),
        state=State.SUCCEEDED,
        anchor=1000.0,
        due_at=None,
        lease_until=None,
        response=None,
        note=None,
        durable=False,
    )
    completion = list(trace)
    store.close()
    assert write_ahead[0] == "PRAGMA synchronous = FULL"
    assert any(s.startswith("INSERT INTO intents") for s in write_ahead)
    assert completion[0] == "PRAGMA synchronous = NORMAL"


def test_normal_durability_never_syncs_full(outbox_path: Path) -> None:
    """durability='normal' relaxes the write-ahead commit too."""
    store = SQLiteStore(outbox_path, durability="normal")
    trace: list[str] = []
    store._conn.set_trace_callback(trace.append)
    store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10)
    store.close()
    assert "PRAGMA synchronous = FULL" not in trace
    assert "PRAGMA synchronous = NORMAL" in trace


def test_large_response_bodies_are_truncated_with_a_hash(make_client: ClientFactory) -> None:
    """A body over the stored limit is kept as its head, flagged truncated, with a SHA-256."""
    big = b"x" * ((1 << 20) + 10)
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(201, content=big)))
    live = client.post_once("/c", json={}, intent="big")
    assert live.content == big
    stored = client.post_once("/c", json={}, intent="big")
    assert stored.extensions["postonce"].truncated is True
    assert len(stored.content) == 1 << 20
    assert isinstance(client.outbox, SQLiteStore)
    conn = sqlite3.connect(client.outbox.path)
    (digest,) = conn.execute("SELECT response_sha256 FROM intents").fetchone()
    conn.close()
    import hashlib

    assert digest == hashlib.sha256(big).hexdigest()


def test_wal_files_share_the_private_mode(make_client: ClientFactory, outbox_path: Path) -> None:
    """SQLite's -wal and -shm files are no more readable than the outbox itself."""
    client = make_client(transport=httpx.MockTransport(lambda r: httpx.Response(201)))
    client.post_once("/c", json={}, intent="wal")
    for suffix in ("-wal", "-shm"):
        side = Path(str(outbox_path) + suffix)
        if side.exists():
            assert stat.S_IMODE(side.stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(outbox_path).st_mode) == 0o600
