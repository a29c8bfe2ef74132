"""MemoryOutbox: the in-memory Store keeps the SQLite outbox's rules, atomically, across threads.

The parametrised suite (``backend == "memory"``) covers it through the
clients; these tests pin the store semantics directly, and compare it with
the SQLite outbox call by call.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import postonce
from postonce import SQLiteStore, State, StoredResponse
from postonce._engine import CLOCK_TOLERANCE
from postonce._intent import IllegalMove, Outcome
from postonce._outbox import memory
from postonce._outbox.base import AttemptRecord, Lease, NewIntent, Opened
from postonce.testing import MemoryOutbox


def new_intent(
    reference: str = "r-1",
    key: str | None = None,
    *,
    body: bytes = b"{}",
    fingerprint: str = "f" * 64,
    key_given: bool = False,
) -> NewIntent:
    return NewIntent(
        reference=reference,
        key=key if key is not None else f"k-{reference}",
        key_given=key_given,
        provider="ietf_draft",
        method="POST",
        url="http://api.test/c",
        headers=(("content-type", "application/json"),),
        body=body,
        fingerprint=fingerprint,
        deadline_at=None,
    )


def attempt(
    outcome: Outcome = Outcome.FINAL, status: int | None = 201, at: float = 1000.0
) -> AttemptRecord:
    return AttemptRecord(at, 0.5, outcome, status, None, False)


def finish(
    store: postonce.Store,
    lease: Lease | None,
    state: State = State.SUCCEEDED,
    response: StoredResponse | None = None,
    at: float = 1000.0,
) -> bool:
    assert lease is not None
    return store.record(
        lease,
        attempt(at=at),
        state=state,
        anchor=at,
        due_at=None,
        lease_until=None,
        response=response,
        note=None,
        durable=True,
    )


def opened_lease(opened: Opened) -> Lease:
    assert opened.lease is not None
    return opened.lease


def test_a_stale_lease_is_fenced_everywhere() -> None:
    """After a takeover, every write under the old token is refused and changes nothing."""
    store = MemoryOutbox()
    first = opened_lease(store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10))
    assert store.open_intent(new_intent(), owner="b", now=1005.0, lease_for=10).lease is None
    late = store.open_intent(new_intent(), owner="b", now=1011.0, lease_for=10)
    assert late.lease is not None
    assert late.anchor_before == 1000.0
    assert late.record.first_delivery_at == 1000.0
    before = store.get("r-1")

    assert finish(store, first) is False
    assert store.release(first, now=1012.0, due_at=None, anchor=None) is False
    assert store.settle(first, now=1012.0, state=State.EXPIRED, note="x") is False
    assert store.renew(first, now=1012.0, until=2000.0) is None
    assert store.get("r-1") == before
    assert store.attempts("r-1") == []

    # A token that owned a row which later settled is stale too (settle clears it).
    assert store.settle(late.lease, now=1013.0, state=State.CANCELLED, note="stop") is True
    assert store.renew(late.lease, now=1014.0, until=2000.0) is None
    assert finish(store, late.lease) is False


def test_record_keeps_or_drops_the_lease_and_numbers_attempts() -> None:
    """A retry that keeps the lease keeps the token; attempts are numbered; note coalesces."""
    store = MemoryOutbox()
    lease = opened_lease(store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10))
    kept = store.record(
        lease,
        attempt(Outcome.RETRYABLE, 503),
        state=State.SENDING,
        anchor=1000.0,
        due_at=None,
        lease_until=1050.0,
        response=None,
        note="busy",
        durable=False,
    )
    assert kept is True
    record = store.get("r-1")
    assert record is not None
    assert (record.attempts, record.lease_owner, record.lease_expires_at) == (1, "a", 1050.0)
    assert record.last_outcome is Outcome.RETRYABLE
    assert finish(store, lease, response=StoredResponse(201, (("x", "1"),), b"ok", False, "h"))
    record = store.get("r-1")
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert record.note == "busy"  # a record without a note keeps the last one
    assert record.lease_owner is None
    assert record.lease_expires_at is None
    assert record.response == StoredResponse(201, (("x", "1"),), b"ok", False, "h")
    assert [a.outcome for a in store.attempts("r-1")] == [Outcome.RETRYABLE, Outcome.FINAL]


def test_open_intent_conflicts() -> None:
    """Another request under the reference is a conflict; another reference's key raises."""
    store = MemoryOutbox()
    lease = opened_lease(store.open_intent(new_intent(), owner="a", now=1000.0, lease_for=10))
    other_body = store.open_intent(
        new_intent(fingerprint="0" * 64), owner="b", now=2000.0, lease_for=10
    )
    assert other_body.lease is None
    assert other_body.conflict is not None
    assert "different request" in other_body.conflict
    other_key = store.open_intent(
        new_intent(key="k-else", key_given=True), owner="b", now=2000.0, lease_for=10
    )
    assert other_key.lease is None
    assert other_key.conflict == "it is stored with a different key"
    # A minted key that differs is not a conflict: the stored key is used.
    minted = store.open_intent(new_intent(key="k-else"), owner="b", now=2000.0, lease_for=10)
    assert minted.conflict is None
    assert minted.lease is not None
    assert minted.record.key == "k-r-1"
    with pytest.raises(postonce.IntentConflict, match="key already belongs"):
        store.open_intent(new_intent("r-2", key="k-r-1"), owner="c", now=2000.0, lease_for=10)
    assert store.get("r-2") is None
    assert finish(store, lease) is False  # the minted-key open took it over


def test_claim_due_order_limit_and_arms() -> None:
    """Oldest due first (due time, else lease expiry, then id), at most ``limit``."""
    store = MemoryOutbox()
    leases = {
        name: opened_lease(store.open_intent(new_intent(name), owner="a", now=1000.0, lease_for=5))
        for name in ("p-late", "dead", "p-early", "p-tie", "future", "live", "done")
    }
    store.release(leases["p-late"], now=1000.0, due_at=1003.0, anchor=None)
    store.release(leases["p-early"], now=1000.0, due_at=1001.0, anchor=None)
    store.release(leases["p-tie"], now=1000.0, due_at=1003.0, anchor=None)
    store.release(leases["future"], now=1000.0, due_at=9000.0, anchor=None)
    store.renew(leases["live"], now=1000.0, until=5000.0)
    finish(store, leases["done"])
    # "dead" is sending under the lease that expires at 1005.

    first = store.claim_due(owner="d", now=1010.0, limit=2, lease_for=30)
    assert [o.record.reference for o in first] == ["p-early", "p-late"]
    rest = store.claim_due(owner="d", now=1010.0, limit=10, lease_for=30)
    assert [o.record.reference for o in rest] == ["p-tie", "dead"]
    assert store.claim_due(owner="d", now=1010.0, limit=10, lease_for=30) == []
    assert store.claim_due(owner="d", now=1010.0, limit=0, lease_for=30) == []

    claimed = first[0]
    assert claimed.lease is not None
    assert claimed.record.state is State.SENDING
    assert claimed.record.lease_expires_at == 1040.0
    assert claimed.anchor_before is None  # released with no anchor: never sent
    assert claimed.record.first_delivery_at == 1010.0
    assert rest[1].anchor_before == 1000.0  # the dead sender may have delivered
    assert store.get("p-early") == claimed.record


def test_claim_due_by_earlier_and_a_clock_that_went_back() -> None:
    """``due_by`` only narrows; a pending row touched in the future is due at once."""
    store = MemoryOutbox()
    lease = opened_lease(store.open_intent(new_intent(), owner="a", now=5000.0, lease_for=5))
    store.release(lease, now=5000.0, due_at=5100.0, anchor=None)
    assert store.claim_due(owner="d", now=5200.0, limit=5, lease_for=5, due_by=5050.0) == []
    assert store.claim_due(owner="d", now=5050.0, limit=5, lease_for=5, due_by=9999.0) == []
    # The clock jumped back more than the tolerance: updated_at is in the future.
    back = 5000.0 - CLOCK_TOLERANCE - 1
    (claimed,) = store.claim_due(owner="d", now=back, limit=5, lease_for=5)
    assert claimed.record.reference == "r-1"


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_a_due_row_with_no_due_time_sorts_first(kind: str, tmp_path: Path) -> None:
    """COALESCE(due_at, lease_expires_at) NULL sorts before any time, as SQLite sorts it."""
    store: postonce.Store = (
        SQLiteStore(tmp_path / "o.sqlite3") if kind == "sqlite" else MemoryOutbox()
    )
    dated = opened_lease(store.open_intent(new_intent("dated"), owner="a", now=5000.0, lease_for=5))
    store.release(dated, now=5000.0, due_at=4000.0, anchor=None)
    undated = opened_lease(
        store.open_intent(new_intent("undated"), owner="a", now=5000.0, lease_for=5)
    )
    store.record(
        undated,
        attempt(Outcome.NOT_SENT, None, at=5000.0),
        state=State.PENDING,
        anchor=None,
        due_at=None,
        lease_until=None,
        response=None,
        note=None,
        durable=True,
    )
    # The clock went back: "undated" was touched in the future, so it is due too.
    now = 5000.0 - CLOCK_TOLERANCE - 2
    (first,) = store.claim_due(owner="d", now=now, limit=1, lease_for=5)
    assert first.record.reference == "undated"
    store.close()


def test_purge_keeps_tombstones_then_deletes_them() -> None:
    """Purge strips finished rows to tombstones (never expired ones); tombstones go later."""
    store = MemoryOutbox()
    answer = StoredResponse(201, (("x-secret", "s"),), b"body", False, "abc")
    for name in ("ok", "expired", "recent"):
        lease = opened_lease(store.open_intent(new_intent(name), owner="a", now=100.0, lease_for=5))
        state = State.EXPIRED if name == "expired" else State.SUCCEEDED
        finish(store, lease, state, answer, at=900.0 if name == "recent" else 100.0)

    assert store.purge(before=500.0, tombstones=False, now=1000.0) == 1
    ok = store.get("ok")
    assert ok is not None
    assert ok.purged_at == 1000.0
    assert (ok.body, ok.headers) == (b"", ())
    assert ok.response == StoredResponse(201, (), b"", False, "abc")
    assert (ok.key, ok.fingerprint, ok.state, ok.attempts) == ("k-ok", "f" * 64, State.SUCCEEDED, 1)
    assert store.attempts("ok") == []
    assert store.attempts("recent") != []
    assert store.purge(before=500.0, tombstones=False, now=1001.0) == 0  # already purged
    stats = store.stats(now=1000.0)
    assert stats["tombstones"] == 1
    assert stats["states"]["succeeded"] == 1  # tombstones are not counted by state
    assert stats["expired_needing_attention"] == 1

    again = store.open_intent(new_intent("ok"), owner="b", now=1100.0, lease_for=5)
    assert again.lease is None
    assert again.record.purged_at == 1000.0

    assert store.purge(before=1000.0, tombstones=True, now=1200.0) == 0  # not older than that
    assert store.purge(before=1000.5, tombstones=True, now=1200.0) == 1
    assert store.get("ok") is None
    fresh = store.open_intent(new_intent("ok"), owner="b", now=1300.0, lease_for=5)
    assert fresh.created
    assert fresh.lease is not None


def test_run_batch_undoes_a_failing_call_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A call that fails (even half way through its changes) changes nothing; the rest commit."""
    store = MemoryOutbox()
    for name in ("a", "b"):
        lease = opened_lease(
            store.open_intent(new_intent(name), owner="x", now=1000.0, lease_for=1)
        )
        store.release(lease, now=1000.0, due_at=1000.0, anchor=None)
    tokens = iter([b"\x01" * 12, b"\x02" * 12])

    def urandom(n: int) -> bytes:
        try:
            return next(tokens)
        except StopIteration:
            raise OSError("no entropy") from None

    # claim_due takes "a", then fails to mint a token for "b": "a" must be pending again.
    monkeypatch.setattr(memory, "os", SimpleNamespace(urandom=urandom))
    results = store.run_batch(
        [
            ("open_intent", {"new": new_intent("c"), "owner": "x", "now": 1.0, "lease_for": 1}),
            ("claim_due", {"owner": "d", "now": 2000.0, "limit": 10, "lease_for": 30}),
            ("operator_move", {"reference": "nope", "to": State.CANCELLED, "now": 1, "note": ""}),
            ("operator_move", {"reference": "a", "to": State.SUCCEEDED, "now": 1, "note": ""}),
            ("operator_move", {"reference": "a", "to": State.CANCELLED, "now": 1, "note": "n"}),
        ]
    )
    assert [ok for ok, _ in results] == [True, False, False, False, True]
    assert isinstance(results[1][1], OSError)
    assert isinstance(results[2][1], KeyError)
    assert isinstance(results[3][1], IllegalMove)
    created = results[0][1]
    assert isinstance(created, Opened)
    assert created.created
    b = store.get("b")
    assert b is not None
    assert (b.state, b.lease_owner) == (State.PENDING, None)
    a = store.get("a")
    assert a is not None
    assert (a.state, a.note) == (State.CANCELLED, "n")
    assert [r.reference for r in store.list_intents()] == ["c", "b", "a"]


def test_a_failing_single_call_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a batch too: a claim that fails part way leaves every row as it was."""
    store = MemoryOutbox()
    for name in ("a", "b"):
        store.open_intent(new_intent(name), owner="x", now=1000.0, lease_for=1)
    before = store.list_intents()
    calls = iter([b"\x01" * 12])
    monkeypatch.setattr(memory, "os", SimpleNamespace(urandom=lambda n: next(calls)))
    with pytest.raises(StopIteration):
        store.claim_due(owner="d", now=2000.0, limit=10, lease_for=30)
    assert store.list_intents() == before


def test_concurrent_opens_of_one_reference_grant_one_lease() -> None:
    """Sixteen threads race to open one intent, round after round: exactly one lease each."""
    store = MemoryOutbox()
    for round_ in range(20):
        barrier = threading.Barrier(16)
        results: list[Opened] = []
        errors: list[BaseException] = []

        def race(
            round_: int = round_,
            barrier: threading.Barrier = barrier,
            results: list[Opened] = results,
            errors: list[BaseException] = errors,
        ) -> None:
            barrier.wait()
            try:
                results.append(
                    store.open_intent(
                        new_intent(f"race-{round_}"), owner="w", now=1000.0, lease_for=60
                    )
                )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=race) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert sum(o.lease is not None for o in results) == 1
        assert sum(o.created for o in results) == 1
    assert len(store.list_intents()) == 20


def test_parallel_claims_take_disjoint_sets() -> None:
    """Claimers on several threads never take one intent twice."""
    store = MemoryOutbox()
    for i in range(300):
        store.open_intent(new_intent(f"p{i}"), owner="dead", now=1000.0, lease_for=1)
    taken: list[list[str]] = [[] for _ in range(6)]

    def claimer(n: int) -> None:
        while batch := store.claim_due(owner=f"c{n}", now=2000.0, limit=7, lease_for=600):
            taken[n].extend(o.record.reference for o in batch)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [ref for part in taken for ref in part]
    assert sorted(everything) == sorted(f"p{i}" for i in range(300))


def test_nothing_returned_aliases_the_store() -> None:
    """Lists handed out are the caller's; a mutable body given in is copied."""
    store = MemoryOutbox()
    body = bytearray(b'{"amount":1}')
    lease = opened_lease(
        store.open_intent(new_intent(body=body), owner="a", now=1000.0, lease_for=5)  # type: ignore[arg-type]
    )
    body[:] = b"changed"
    finish(store, lease)
    record = store.get("r-1")
    assert record is not None
    assert record.body == b'{"amount":1}'
    assert type(record.body) is bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = State.PENDING  # type: ignore[misc]
    store.attempts("r-1").clear()
    store.list_intents().clear()
    assert len(store.attempts("r-1")) == 1
    assert len(store.list_intents()) == 1


def test_close_keeps_the_data_and_a_client_uses_it() -> None:
    """Passed as ``outbox=``, the store is the caller's: closing the client leaves it open."""
    store = MemoryOutbox()
    transport = httpx.MockTransport(lambda request: httpx.Response(201, json={"id": 1}))
    with postonce.Client("http://api.test", outbox=store, transport=transport) as client:
        assert client.post_once("/c", json={"a": 1}, intent="order-1").status_code == 201
    store.close()
    record = store.get("order-1")
    assert record is not None
    assert record.state is State.SUCCEEDED
    assert record.response is not None
    assert record.response.status == 201
    (row,) = store.export_rows()
    assert row["reference"] == "order-1"
    assert row["attempts"][0]["status"] == 201


# -- the same calls on SQLite and in memory give the same answers ------------------------


def _plain(value: Any) -> Any:
    """A store's answer without its random lease tokens, for comparing two stores."""
    if isinstance(value, Lease):
        return ("lease", value.intent_id, value.owner, value.expires_at)
    if isinstance(value, Opened):
        return (_plain(value.record), _plain(value.lease), value.created, value.conflict,
                value.anchor_before)  # fmt: skip
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, BaseException):
        return (type(value).__name__, str(value))
    return value


def _script(store: postonce.Store, seed: int) -> list[Any]:
    """Random store calls from a seed; every answer and the final contents, in order."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(6)]
    leases: list[Lease] = []
    seen: list[Any] = []
    now = 1000.0

    def some_lease() -> Lease | None:
        return rng.choice(leases) if leases else None

    def call(method: str, **kwargs: Any) -> None:
        try:
            result = getattr(store, method)(**kwargs)
        except Exception as exc:
            seen.append((method, _plain(exc)))
            return
        if isinstance(result, Opened) and result.lease is not None:
            leases.append(result.lease)
        for opened in result if isinstance(result, list) else []:
            if isinstance(opened, Opened) and opened.lease is not None:
                leases.append(opened.lease)
        if isinstance(result, Lease):
            leases.append(result)
        seen.append((method, _plain(result)))

    for _ in range(400):
        now += rng.choice([0.0, 0.5, 1.0, 5.0, 30.0, 200.0])
        if rng.random() < 0.03:
            now -= 2 * CLOCK_TOLERANCE  # the wall clock steps back
        ref = rng.choice(names)
        op = rng.randrange(11)
        lease = some_lease()
        if op <= 2:
            call(
                "open_intent",
                new=new_intent(
                    ref,
                    key=rng.choice([f"k-{ref}", f"k-{ref}", "k-shared"]),
                    fingerprint=rng.choice(["f" * 64, "f" * 64, "0" * 64]),
                    key_given=rng.random() < 0.3,
                ),
                owner=rng.choice(["a", "b"]),
                now=now,
                lease_for=rng.choice([1.0, 10.0, 60.0]),
            )
        elif op == 3 and lease is not None:
            keep = rng.random() < 0.3
            call(
                "record",
                lease=lease,
                attempt=AttemptRecord(
                    now,
                    0.25,
                    rng.choice(list(Outcome)),
                    rng.choice([None, 201, 503]),
                    rng.choice([None, "ReadTimeout"]),
                    rng.random() < 0.2,
                ),
                state=rng.choice([State.PENDING, State.SENDING, State.SUCCEEDED, State.EXPIRED]),
                anchor=rng.choice([None, now - 1.0]),
                due_at=rng.choice([None, now + 5.0, now - 5.0]),
                lease_until=now + 20.0 if keep else None,
                response=rng.choice(
                    [None, StoredResponse(201, (("a", "b"),), b"ok", rng.random() < 0.5, "s")]
                ),
                note=rng.choice([None, "note"]),
                durable=rng.random() < 0.5,
            )
        elif op == 4 and lease is not None:
            call("renew", lease=lease, now=now, until=now + rng.choice([-1.0, 30.0]))
        elif op == 5 and lease is not None:
            call(
                "release",
                lease=lease,
                now=now,
                due_at=rng.choice([None, now + 10.0, now + 1000.0]),
                anchor=rng.choice([None, now - 3.0]),
            )
        elif op == 6 and lease is not None:
            call("settle", lease=lease, now=now, state=rng.choice(list(State)), note="settled")
        elif op == 7:
            call(
                "claim_due",
                owner="drain",
                now=now,
                limit=rng.choice([0, 1, 3, 100]),
                lease_for=rng.choice([1.0, 30.0]),
                due_by=rng.choice([None, now - 10.0, now + 10.0]),
            )
        elif op == 8:
            call("operator_move", reference=ref, to=rng.choice(list(State)), now=now, note="op")
        elif op == 9:
            call(
                "purge",
                before=now - rng.choice([0.0, 50.0, 500.0]),
                tombstones=rng.random() < 0.3,
                now=now,
            )
        else:
            call("get", reference=ref)
            call("attempts", reference=ref)
            call("list_intents", state=rng.choice([None, *State]), limit=rng.choice([None, 0, 2]))
            call("stats", now=now)
    seen.append(_plain(store.list_intents()))
    seen.append(list(store.export_rows()))
    seen.append(store.stats(now=now))
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_every_answer_matches_the_sqlite_outbox(tmp_path: Path, seed: int) -> None:
    """The same random calls on SQLiteStore and MemoryOutbox answer the same, step by step."""
    sqlite = SQLiteStore(tmp_path / "outbox.sqlite3", durability="normal")
    try:
        expected = _script(sqlite, seed)
    finally:
        sqlite.close()
    actual = _script(MemoryOutbox(), seed)
    assert len(actual) == len(expected)
    for step, (mine, theirs) in enumerate(zip(actual, expected, strict=True)):
        assert mine == theirs, f"step {step}"
