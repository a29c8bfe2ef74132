"""What every outbox backend offers the shells, and the records it trades in.

A store is a ledger with leases. It decides nothing about delivery: the
engine does. Its one job is to make each of these moves atomic and durable:

* ``open_intent`` — the write-ahead: create the intent, or find it, and take
  its lease, in one transaction that is committed before any send;
* ``record`` — one attempt and the state it leads to, accepted only while the
  caller's lease token still owns the row (fencing);
* ``renew``, ``release``, ``settle`` — lease upkeep and terminal moves
  without a send.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from .._frozen import maker, quick_init
from .._intent import IntentRecord, Outcome, State, StoredResponse

__all__ = [
    "FOREIGN_SHOWN",
    "AttemptRecord",
    "Census",
    "Foreign",
    "Lease",
    "NewIntent",
    "Opened",
    "Purged",
    "Store",
    "run_calls",
]


@quick_init
@dataclass(frozen=True, slots=True)
class NewIntent:
    """An intent as a caller asks for it, before it is stored."""

    reference: str
    key: str
    key_given: bool  # the caller chose the key; another stored key is a conflict
    provider: str
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    fingerprint: str
    deadline_at: float | None
    #: Who may send it: the sending client's identity (None: unowned, adopted by
    #: the first client whose origins include ``origin``).
    sender: str | None = None
    #: ``scheme://host:port`` the request is addressed to.
    origin: str | None = None
    #: The caller's JSON data, as text (``meta=``): stored, never sent or fingerprinted.
    meta: str | None = None
    #: The names of the call's own secrets its sends need (``IntentRecord.needs``).
    needs: tuple[str, ...] = ()


@quick_init
@dataclass(frozen=True, slots=True)
class Lease:
    """The right to send one intent, until ``expires_at``, proven by ``token``."""

    intent_id: int
    token: str
    owner: str
    expires_at: float
    #: Taken by the write-ahead that created the intent: its first send follows
    #: at once, from this process (``decide.carried``).
    fresh: bool = False


#: Leases are taken on every call, and intent records made for every intent opened
#: and every row read: built by their makers rather than the class call (the same
#: records, in half the CPU: see ``maker``).
new_lease = maker(Lease)
new_intent_record = maker(IntentRecord)


@quick_init
@dataclass(frozen=True, slots=True)
class Opened:
    """What ``open_intent`` found, and the lease it took if it took one."""

    record: IntentRecord
    lease: Lease | None
    created: bool
    conflict: str | None  # why the stored intent is not this request; nothing claimed
    anchor_before: float | None  # the horizon anchor before this claim set it


@dataclass(frozen=True, slots=True)
class Foreign:
    """Due intents a drain may not send, of one sender and origin: whose client sends them."""

    sender: str | None  # None: unowned, written by a release from before sender identities
    origin: str | None
    due: int
    #: When the first of them fell due (a pending row's due time, a sending row's
    #: lease expiry): none of them has been claimed since. None: the store does not say.
    waiting_since: float | None = None


@dataclass(frozen=True, slots=True)
class Census:
    """What a drain could not finish, and why: nothing unfinished is invisible."""

    not_ours: int  # due, but another sender's or to another origin
    in_flight_elsewhere: int  # this sender's, leased by another owner (live, or not yet known dead)
    next_lease_expiry: float | None  # the earliest of those leases' expiries
    #: Whose the ``not_ours`` intents are, most first (at most FOREIGN_SHOWN groups).
    #: Empty from a store that does not say (its ``not_ours`` still counts them).
    foreign: tuple[Foreign, ...] = ()
    #: This sender's settlements still owed after their handler raised.
    settle_failing: int = 0
    #: Due intents of no sender addressed to this client's origins (written by an
    #: older release after the migration): the drain's next pass adopts them.
    unowned: int = 0
    #: The ``now`` the census counted at (what ``waiting_since`` is measured against).
    at: float | None = None


#: The most sender-and-origin groups a census names; ``not_ours`` counts them all.
FOREIGN_SHOWN = 10


class Purged(int):
    """What ``purge`` returns: how many intents it purged (or tombstones it deleted).

    An ``int``, so a caller that counts keeps working; ``kept_owed`` is how
    many of that age it kept because their settlement is still owed (a store
    that returns a plain ``int`` does not say).
    """

    kept_owed: int

    def __new__(cls, purged: int, kept_owed: int = 0) -> Purged:
        made = super().__new__(cls, purged)
        made.kept_owed = kept_owed
        return made

    def __repr__(self) -> str:
        return f"Purged({int(self)}, kept_owed={self.kept_owed})"


@quick_init
@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One send, as the attempts table keeps it."""

    started_at: float
    duration: float
    outcome: Outcome
    status: int | None
    error_type: str | None
    replayed: bool


class Store(Protocol):
    """One implementation per backend; a blocking API the shells call."""

    def open_intent(
        self,
        new: NewIntent,
        *,
        owner: str,
        now: float,
        lease_for: float,
        alive: Callable[[str], bool] = ...,
    ) -> Opened: ...

    def record(
        self,
        lease: Lease,
        attempt: AttemptRecord,
        *,
        state: State,
        anchor: float | None,
        due_at: float | None,
        lease_until: float | None,
        response: StoredResponse | None,
        note: str | None,
        durable: bool,
        settle_hold: float | None = None,
    ) -> bool: ...

    def renew(self, lease: Lease, *, now: float, until: float) -> Lease | None: ...

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool: ...

    def settle(
        self,
        lease: Lease,
        *,
        now: float,
        state: State,
        note: str,
        settle_hold: float | None = None,
    ) -> bool: ...

    def claim_settlements(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        hold: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]: ...

    def take_settlement(
        self, *, intent_id: int, owed_at: float, now: float, hold: float
    ) -> float | None: ...

    def settlement_done(self, *, intent_id: int, now: float, owed_at: float) -> bool: ...

    def settlement_failed(
        self, *, intent_id: int, error: str, retry_at: float, owed_at: float
    ) -> bool: ...

    def claim_expired(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        every: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]: ...

    def wait_change(self, intent_id: int, timeout: float) -> None: ...

    def claim_due(
        self,
        *,
        owner: str,
        now: float,
        limit: int,
        lease_for: float,
        due_by: float | None = None,
        sender: str | None = None,
        origins: Collection[str] | None = None,
        alive: Callable[[str], bool] = ...,
    ) -> list[Opened]: ...

    def adopt(
        self,
        *,
        sender: str,
        origins: Collection[str] | None,
        previous: str | None = None,
        unfinished: bool = False,
    ) -> int: ...

    def census(self, *, sender: str, origins: Collection[str] | None, now: float) -> Census: ...

    def get(self, reference: str) -> IntentRecord | None: ...

    def attempts(self, reference: str) -> list[AttemptRecord]:
        """Every attempt of the intent, oldest first; [] for an unknown reference.

        A first attempt that ended the intent with a stored answer is kept by the
        intent row, not in the attempts table (``decide.carried``): it is read
        back from the row, its start being the write-ahead's time.
        """
        ...

    def list_intents(
        self, *, state: State | None = None, limit: int | None = None
    ) -> list[IntentRecord]: ...

    def stats(self, *, now: float) -> dict[str, Any]: ...

    def operator_move(
        self,
        reference: str,
        to: State,
        *,
        now: float,
        note: str,
        settle_hold: float | None = None,
    ) -> IntentRecord: ...

    def purge(self, *, before: float, tombstones: bool, now: float) -> int:
        """Forget succeeded, failed and cancelled intents last changed before ``before``.

        Each keeps a tombstone; ``tombstones=True`` deletes tombstones purged
        before ``before`` instead. Never purges an expired or indeterminate
        intent (``decide.PURGEABLE``), nor one whose settlement is still owed
        (``settle_due_at`` set): its handler has not heard of it yet. Returns
        how many were purged, as a :class:`Purged` whose ``kept_owed`` counts
        those of that age kept for an owed settlement (a plain ``int`` is
        accepted from a custom store: the CLI then does not say).
        """
        ...

    def export_rows(self) -> Iterator[dict[str, Any]]: ...

    def close(self) -> None: ...


def run_calls(store: Store, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[bool, Any]]:
    """Run store calls in one transaction where the store can (``run_batch``), else one by one.

    Returns ``(ok, result or exception)`` per call; never raises.
    """
    batch = getattr(store, "run_batch", None)
    if batch is not None:
        try:
            results: list[tuple[bool, Any]] = batch(calls)
        except Exception as exc:
            return [(False, exc)] * len(calls)
        return results
    results = []
    for method, kwargs in calls:
        try:
            results.append((True, getattr(store, method)(**kwargs)))
        except Exception as exc:
            results.append((False, exc))
    return results
