"""The PostgreSQL outbox's few-round-trip writes: pipelined records, group commit, fencing.

A record is one statement sent with its BEGIN and COMMIT in one pipeline, and
records made by several threads at once share a transaction. These tests prove
on a real server that the claim-token fence holds for them, that a write is
committed when it returns, that one bad write in a group fails alone, and
what a record costs in round trips.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from psycopg import sql

from postonce import OutboxError, State
from postonce._intent import Outcome
from postonce._outbox import postgres
from postonce._outbox.base import AttemptRecord, Lease
from postonce._outbox.locate import split_schema
from postonce._outbox.postgres import PostgresStore, _GroupCommit, _Queued, binary_array
from postonce._outbox.threaded import StoreThread
from tests.conftest import PG_URL, pg_schema, record_final
from tests.test_outbox import new_intent


@pytest.fixture
def pg_outbox() -> Iterator[str]:
    with pg_schema() as url:
        yield url


@pytest.fixture
def store() -> Iterator[PostgresStore]:
    with pg_schema() as url:
        base, schema = split_schema(url)
        opened = PostgresStore(base, schema=schema)
        try:
            yield opened
        finally:
            opened.close()


def record(
    store: PostgresStore,
    lease: Lease,
    *,
    state: State = State.SUCCEEDED,
    status: int = 201,
    durable: bool = False,
) -> bool:
    """Record a final answer under ``lease`` as the drain's flow does."""
    return record_final(store, lease, state=state, status=status, durable=durable)


def record_503(store: PostgresStore, lease: Lease, *, keep_until: float | None) -> bool:
    """Record a retryable 503, due again at 1011: the lease kept until ``keep_until``
    (a foreground retry, still sending), or handed back (None: left pending)."""
    return store.record(
        lease,
        AttemptRecord(1010.0, 0.1, Outcome.RETRYABLE, 503, None, False),
        state=State.SENDING if keep_until is not None else State.PENDING,
        anchor=1010.0,
        due_at=1011.0,
        lease_until=keep_until,
        response=None,
        note=None,
        durable=False,
    )


def due_intents(store: PostgresStore, count: int) -> None:
    """``count`` intents written ahead at t=1000 by an owner whose lease ran out at 1001."""
    for i in range(count):
        store.open_intent(new_intent(f"r-{i}", f"k-{i}"), owner="gone", now=1000.0, lease_for=1.0)


def committed_attempts(store: PostgresStore, reference: str) -> list[tuple[int, str | None]]:
    """(number, owner) of each attempts row, read on a connection of its own."""
    with psycopg.connect(PG_URL) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT a.number, a.owner FROM {schema}.attempts a"
                " JOIN {schema}.intents i ON i.id = a.intent_id"
                " WHERE i.reference = %s ORDER BY a.number"
            ).format(schema=sql.Identifier(store.schema)),
            (reference,),
        ).fetchall()
    return [(int(n), o) for n, o in rows]


def test_a_record_from_a_lease_taken_over_is_refused(store: PostgresStore) -> None:
    """The pipelined record is fenced by the claim token: the old owner writes nothing."""
    due_intents(store, 1)
    (first,) = store.claim_due(owner="slow/1", now=1010.0, limit=10, lease_for=5.0)
    assert first.lease is not None
    # slow/1's lease runs out; another drain takes the intent over with a new token.
    (second,) = store.claim_due(owner="fast/2", now=1020.0, limit=10, lease_for=30.0)
    assert second.lease is not None
    assert second.lease.token != first.lease.token

    assert record(store, first.lease) is False
    assert store._fenced(first.lease, {"note": "late"}, durable=True) is False
    found = store.get("r-0")
    assert found is not None
    assert (found.state, found.attempts, found.lease_owner) == (State.SENDING, 0, "fast/2")
    assert committed_attempts(store, "r-0") == []

    assert record(store, second.lease) is True
    found = store.get("r-0")
    assert found is not None
    assert (found.state, found.attempts) == (State.SUCCEEDED, 1)
    assert committed_attempts(store, "r-0") == [(1, "fast/2")]
    # Ended: the token is gone, so not even the new owner can record again.
    assert record(store, second.lease) is False
    assert committed_attempts(store, "r-0") == [(1, "fast/2")]


def test_attempts_are_numbered_by_the_row_under_the_fence(store: PostgresStore) -> None:
    """A retry's record keeps the lease; each attempt gets the next number, under its owner."""
    due_intents(store, 1)
    (opened,) = store.claim_due(owner="drain/1", now=1010.0, limit=10, lease_for=30.0)
    assert opened.lease is not None
    for _ in range(3):
        assert record_503(store, opened.lease, keep_until=1100.0)
    assert committed_attempts(store, "r-0") == [(1, "drain/1"), (2, "drain/1"), (3, "drain/1")]
    assert record(store, opened.lease, state=State.FAILED, status=400, durable=True)
    found = store.get("r-0")
    assert found is not None
    assert (found.state, found.attempts) == (State.FAILED, 4)


def test_records_from_many_threads_are_each_committed_once(store: PostgresStore) -> None:
    """Threads recording at once (group committed): each answer is its own, and committed."""
    due_intents(store, 40)
    claimed = store.claim_due(owner="drain/1", now=1010.0, limit=40, lease_for=5.0)
    # Half are taken over before their records land: those records must be refused.
    taken = store.claim_due(owner="drain/2", now=1020.0, limit=20, lease_for=30.0)
    stolen = {opened.record.reference for opened in taken}
    assert len(stolen) == 20
    answers: dict[str, bool] = {}
    start = threading.Barrier(len(claimed))

    def one(reference: str, lease: Lease) -> None:
        start.wait()
        answers[reference] = record(store, lease, durable=reference.endswith("7"))

    threads = [
        threading.Thread(target=one, args=(opened.record.reference, opened.lease))
        for opened in claimed
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == {
        opened.record.reference: opened.record.reference not in stolen for opened in claimed
    }
    for opened in claimed:
        reference = opened.record.reference
        if reference in stolen:
            assert committed_attempts(store, reference) == []
        else:
            assert committed_attempts(store, reference) == [(1, "drain/1")]


def test_one_refused_write_in_a_group_fails_alone(store: PostgresStore) -> None:
    """A group the server refuses is retried one write at a time: only the bad one fails."""
    due_intents(store, 2)
    claimed = store.claim_due(owner="drain/1", now=1010.0, limit=2, lease_for=30.0)
    fenced = store._shaped(
        "WITH u AS (UPDATE {intents} SET note = ? WHERE id = ? AND claim_token = ? RETURNING id)"
        " SELECT 1, set_config('synchronous_commit', ?, true) FROM u",
        ("note",),
    )
    good = [
        _Queued(fenced, ("kept", o.record.id, o.lease.token), durable=False)
        for o in claimed
        if o.lease is not None
    ]
    bad = _Queued("SELECT 1 / 0, %s", (), durable=False)  # a data exception: 22012
    store._commit_group([good[0], bad, good[1]])
    assert all(q.finished for q in (*good, bad))
    assert [q.result() for q in good] == [(1, "off"), (1, "off")]
    with pytest.raises(OutboxError, match="division by zero") as refused:
        bad.result()
    assert isinstance(refused.value.__cause__, psycopg.errors.DivisionByZero)
    assert [store.get(f"r-{i}").note for i in range(2)] == ["kept", "kept"]  # type: ignore[union-attr]
    # The connection went back to the pool clean: the next write works.
    assert record(store, claimed[0].lease)  # type: ignore[arg-type]


@contextmanager
def one_connection_and_a_lease(
    store: PostgresStore, *, check_connections: bool
) -> Iterator[tuple[PostgresStore, Lease]]:
    """A second store on ``store``'s schema with one pooled connection, and a claimed lease."""
    due_intents(store, 1)
    (opened,) = store.claim_due(owner="drain/1", now=1010.0, limit=1, lease_for=30.0)
    assert opened.lease is not None
    base, schema = split_schema(f"{PG_URL}?schema={store.schema}")
    single = PostgresStore(
        base, schema=schema, min_size=1, max_size=1, check_connections=check_connections
    )
    try:
        yield single, opened.lease
    finally:
        single.close()


def test_a_record_and_a_read_are_one_round_trip_each(store: PostgresStore) -> None:
    """The hot path's cost, counted from libpq's trace: a record (BEGIN to COMMIT) and a read."""
    with one_connection_and_a_lease(store, check_connections=False) as (quiet, lease):
        assert round_trips(quiet, lambda: record(quiet, lease, durable=True)) == 1
        assert round_trips(quiet, lambda: quiet.get("r-0")) == 1


def round_trips(store: PostgresStore, call: Callable[[], object]) -> int:
    """Round trips ``call`` makes on ``store``'s one pooled connection, from libpq's trace.

    Each turn from messages the client sent to messages the server answered is one.
    """
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        with open(trace, "w") as out:
            with store._pool.connection() as conn:
                conn.pgconn.trace(out.fileno())
                conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                assert call()
            finally:
                with store._pool.connection() as conn:
                    conn.pgconn.untrace()  # flushes the trace
        trips, last = 0, "B"
        for line in trace.read_text().splitlines():
            direction = line.split("\t", 1)[0]
            if direction == "B" and last == "F":
                trips += 1
            if direction in ("F", "B"):
                last = direction
    return trips


def test_a_terminal_record_notifies_on_commit(store: PostgresStore) -> None:
    """A record that ends the intent is heard by LISTEN (Client.wait); a retry's is not."""
    due_intents(store, 2)
    first, second = store.claim_due(owner="drain/1", now=1010.0, limit=2, lease_for=30.0)
    assert first.lease is not None
    assert second.lease is not None
    with psycopg.connect(store.url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{store._channel}"')
        assert record_503(store, first.lease, keep_until=None)
        assert record(store, second.lease)
        heard = [n.payload for n in listener.notifies(timeout=1.0, stop_after=2)]
    assert heard == [str(second.record.id)]


def test_a_lost_connection_fails_every_write_of_its_group(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group whose commit is unknown (the connection broke) is never retried: all fail."""
    tries: list[bool] = []

    @contextmanager
    def lost() -> Iterator[psycopg.Connection[Any]]:
        tries.append(True)
        cause = psycopg.OperationalError("server closed the connection unexpectedly")
        raise OutboxError(f"PostgreSQL outbox failed: {cause}") from cause
        yield  # a generator, as the real one

    monkeypatch.setattr(store, "_connection", lost)
    queued = [_Queued("SELECT 1", (), durable=False), _Queued("SELECT 2", (), durable=True)]
    store._commit_group(queued)
    assert tries == [True]  # once: never one by one
    for q in queued:
        assert q.finished
        with pytest.raises(OutboxError, match="server closed"):
            q.result()


def wal_syncs(store: PostgresStore) -> int:
    """WAL flushes so far, as the server counts them, with ``store``'s own reported.

    A backend reports its statistics when it goes idle, at most once a second:
    after a second, one more statement on ``store``'s connection reports them.
    """
    time.sleep(1.1)
    store._read("SELECT 1", ())
    time.sleep(0.1)
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def _wal_syncs_of_records(store: PostgresStore, durable: bool, batch: int) -> int:
    """WAL syncs the server made while 30 due intents of ``batch`` were recorded, one by one."""
    for i in range(30):
        store.open_intent(
            new_intent(f"b{batch}-{i}", f"k-b{batch}-{i}"), owner="gone", now=1000.0, lease_for=1.0
        )
    claimed = store.claim_due(owner="drain/1", now=1010.0, limit=30, lease_for=30.0)
    base, schema = split_schema(f"{PG_URL}?schema={store.schema}")
    alone = PostgresStore(base, schema=schema, min_size=1, max_size=1)
    try:
        before = wal_syncs(alone)
        for opened in claimed:
            assert opened.lease is not None
            assert record(alone, opened.lease, durable=durable)
        return wal_syncs(alone) - before
    finally:
        alone.close()


@pytest.mark.parametrize("durable", [True, False])
def test_a_record_is_as_durable_as_asked(store: PostgresStore, durable: bool) -> None:
    """A durable record waits for its WAL flush; a repairable one does not (one statement each).

    The server's WAL sync count is server-wide: the suite's other workers add to it, never
    take from it. So the repairable case keeps the quietest of up to five batches.
    """
    if durable:
        assert _wal_syncs_of_records(store, True, 0) >= 30
        return
    flushed = _wal_syncs_of_records(store, False, 0)
    for batch in range(1, 5):
        if flushed < 15:
            break
        flushed = min(flushed, _wal_syncs_of_records(store, False, batch))
    assert flushed < 15  # the WAL writer's own, a few a second


def test_a_terminated_idle_connection_costs_no_failed_call(pg_outbox: str) -> None:
    """The pool's check (a poll, no round trip) sees the FATAL a terminated backend sent."""
    app_name = f"postonce-check-{uuid.uuid4().hex[:8]}"
    base, schema = split_schema(f"{pg_outbox}&application_name={app_name}")
    store = PostgresStore(base, schema=schema, min_size=1, max_size=1)
    try:
        assert store.get("nothing") is None
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            (pid,) = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app_name,)
            ).fetchone() or (None,)
            assert pid is not None
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            for _ in range(100):  # until the backend has gone (its FATAL sent)
                gone = conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
                if gone.fetchone() is None:
                    break
                time.sleep(0.05)
        assert store.get("nothing") is None  # no OutboxError: the pool replaced it
    finally:
        store.close()


def test_a_quiet_connection_is_checked_without_a_round_trip(store: PostgresStore) -> None:
    """With check_connections (the default), a record is still one round trip."""
    with one_connection_and_a_lease(store, check_connections=True) as (checked, lease):
        assert round_trips(checked, lambda: record(checked, lease)) == 1


def final_record_kwargs(lease: Lease) -> dict[str, Any]:
    """A final 201's record, as an async client's flow queues it on its store thread."""
    return {
        "lease": lease,
        "attempt": AttemptRecord(1010.0, 0.1, Outcome.FINAL, 201, None, False),
        "state": State.SUCCEEDED,
        "anchor": 1010.0,
        "due_at": None,
        "lease_until": None,
        "response": None,
        "note": None,
        "durable": True,
    }


def test_an_async_clients_record_is_one_round_trip_too(store: PostgresStore) -> None:
    """An async client's store thread runs a PostgreSQL call on its own path.

    Batched into one transaction, as SQLite's calls are, the same record cost
    a savepoint and several statements, one round trip each.
    """
    with one_connection_and_a_lease(store, check_connections=False) as (quiet, lease):
        thread = StoreThread(quiet)

        async def recorded() -> bool:
            with anyio.fail_after(10):
                done: bool = await thread.call("record", final_record_kwargs(lease))
                return done

        try:
            assert round_trips(quiet, lambda: anyio.run(recorded)) == 1
        finally:
            thread.close()
        assert quiet.get("r-0").state is State.SUCCEEDED  # type: ignore[union-attr]


def test_async_records_on_postgresql_run_side_by_side_and_all_commit(
    store: PostgresStore,
) -> None:
    """Eight records queued at once by eight tasks: each commits, on the store's workers."""
    due_intents(store, 8)
    claimed = store.claim_due(owner="drain/1", now=1010.0, limit=8, lease_for=30.0)
    thread = StoreThread(store)
    names: set[str] = set()
    threads: set[int] = set()
    real = store.record

    def record_noting_the_thread(*args: Any, **kwargs: Any) -> bool:
        names.add(threading.current_thread().name)
        threads.add(threading.get_ident())
        time.sleep(0.05)  # long enough for the others to start on other workers
        return real(*args, **kwargs)

    store.record = record_noting_the_thread  # type: ignore[method-assign]

    async def main() -> list[bool]:
        results: list[bool] = []

        async def one(lease: Lease | None) -> None:
            assert lease is not None
            results.append(await thread.call("record", final_record_kwargs(lease)))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                for opened in claimed:
                    group.start_soon(one, opened.lease)
        return results

    try:
        assert anyio.run(main) == [True] * 8
    finally:
        thread.close()
    assert len(threads) > 1
    assert names == {"postonce-outbox-writer"}
    assert [store.get(f"r-{i}").state for i in range(8)] == [State.SUCCEEDED] * 8  # type: ignore[union-attr]


def test_an_async_call_failing_on_postgresql_raises_outbox_error(store: PostgresStore) -> None:
    """A call that fails on a worker wakes its caller with the store's typed error."""
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP TABLE {schema}.attempts, {schema}.intents").format(
                schema=sql.Identifier(store.schema)
            )
        )
    thread = StoreThread(store)

    async def main() -> None:
        with anyio.fail_after(10):
            await thread.call("get", {"reference": "r-0"})

    try:
        with pytest.raises(OutboxError, match="failed"):
            anyio.run(main)
        assert thread._workers  # it ran on a worker, not through a batch
    finally:
        thread.close()


def recording_group() -> tuple[_GroupCommit, list[list[str]], threading.Event, threading.Event]:
    """A group commit that records what it commits, and the events that hold its first group.

    The first group sets ``busy`` and holds until ``release`` is set, so other
    writes can queue, or be interrupted, meanwhile.
    """
    committed: list[list[str]] = []
    busy, release = threading.Event(), threading.Event()

    def commit(group: list[_Queued]) -> None:
        if not committed:
            busy.set()
            release.wait(5)
        committed.append([q.query for q in group])
        for q in group:
            q.row, q.finished = (q.query,), True

    return _GroupCommit(commit), committed, busy, release


@pytest.mark.parametrize("where", ["making its event", "taking its group"])
def test_a_writer_interrupted_on_its_way_in_leaves_the_group_whole(
    monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Ctrl-C as a write makes its event, or as the leader takes its group: later writes go on.

    A write withdrawn before its group was taken must not stay queued with no
    event (the lead handed to it would be lost, and every later write wait).
    """
    group, committed, busy, release = recording_group()
    if where == "making its event":
        leader = threading.Thread(target=group.run, args=("first", (), False))
        leader.start()
        assert busy.wait(5)

        class Queued(_Queued):
            def waits(self) -> threading.Event:
                raise KeyboardInterrupt  # the signal lands inside Event()

        monkeypatch.setattr(postgres, "_Queued", Queued)
        with pytest.raises(KeyboardInterrupt):
            group.run("interrupted", (), False)
        monkeypatch.setattr(postgres, "_Queued", _Queued)
        release.set()
        leader.join(5)
        assert not leader.is_alive()
    else:
        committed.append([])  # no waiting in commit

        class Taking(list[_Queued]):
            def __getitem__(self, index: Any) -> Any:
                raise KeyboardInterrupt  # the signal lands as the leader slices its group

        group._queue = Taking()
        with pytest.raises(KeyboardInterrupt):
            group.run("interrupted", (), False)
        group._queue = list(group._queue)
    after: list[object] = []
    writer = threading.Thread(target=lambda: after.append(group.run("after", (), False)))
    writer.start()
    writer.join(5)
    assert after == [("after",)]  # the lead was not lost with the withdrawn write
    assert "interrupted" not in [q for batch in committed for q in batch]
    assert group._queue == []


def test_a_writer_interrupted_while_queued_does_not_stop_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queued write withdrawn by Ctrl-C is never committed, and the lead still goes on."""
    group, committed, busy, release = recording_group()
    leader = threading.Thread(target=group.run, args=("first", (), False))
    leader.start()
    assert busy.wait(5)

    class Interrupted(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            release.set()  # the leader finishes while this writer is gone
            raise KeyboardInterrupt

    class Queued(_Queued):
        def waits(self) -> threading.Event:
            if self.query != "interrupted":
                return super().waits()
            self.done = Interrupted()
            return self.done

    monkeypatch.setattr(postgres, "_Queued", Queued)
    with pytest.raises(KeyboardInterrupt):
        group.run("interrupted", (), False)
    leader.join(5)
    after: list[object] = []
    writer = threading.Thread(target=lambda: after.append(group.run("after", (), False)))
    writer.start()
    writer.join(5)
    assert after == [("after",)]  # the lead was not lost with the withdrawn write
    assert committed == [["first"], ["after"]]


@pytest.mark.parametrize(
    ("cast", "values", "sent"),
    [
        ("double precision", [1010, 1000.5, None], [1010.0, 1000.5, None]),
        ("double precision", [1.5, 2.5], [1.5, 2.5]),
        ("double precision", [], []),
        ("double precision", [None, None], [None, None]),
        ("bigint", [1, 2], [1, 2]),
        ("text", ["sending", None], ["sending", None]),
        ("double precision", [True, 1.5], [True, 1.5]),  # not an int: left for the driver
    ],
)
def test_a_claims_arrays_widen_only_ints_among_times(
    cast: str, values: list[object], sent: list[object]
) -> None:
    """binary_array makes a float column's ints floats and converts nothing else."""
    converted = binary_array(cast, values)
    assert converted == sent
    assert [type(v) for v in converted] == [type(v) for v in sent]
