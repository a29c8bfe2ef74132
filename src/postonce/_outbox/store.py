"""The store moves every backend makes the same way, written once over two small hooks.

A backend (the SQL store, the memory store) subclasses :class:`StoreBase` and
supplies how a fenced change and a recorded attempt are written; what those
moves change is :mod:`.decide`'s.
"""

from __future__ import annotations

import dataclasses
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from .._intent import IntentRecord, State, StoredResponse
from .._lease import alive as lease_owner_alive
from . import decide
from .base import AttemptRecord, Lease, Opened
from .rows import export_rows

__all__ = ["Mine", "StoreBase", "Take"]


@dataclass(frozen=True, slots=True)
class Mine:
    """Which intents a claim may take: one sender's (None: any), to some origins (None: any).

    ``dead``: owners whose leases have not run out but whose process is gone;
    their intents are due now.
    """

    sender: str | None
    origins: tuple[str, ...] | None
    dead: tuple[str, ...] = ()

    def admits(self, sender: str | None, origin: str | None) -> bool:
        if self.sender is not None and sender != self.sender:
            return False
        return self.origins is None or origin in self.origins


#: Takes one due intent: what to write to its row, and what the claimant is handed.
Take = Callable[[IntentRecord], tuple[Opened, decide.Changes]]


class StoreBase(ABC):
    """Lease upkeep and attempt records, decided once; backends write them."""

    #: A first attempt that ended the intent may be kept by the intent row alone
    #: (``decide.carried``), without an attempts row.
    carries_first_attempt: ClassVar[bool] = True

    #: A record waits on a round trip to a database server. A drain then runs one
    #: flow more than it sends, so one intent's record overlaps the next one's
    #: send; a local store's record has no wait to overlap. An async client runs
    #: a remote store's calls side by side, each on its own path (``StoreThread``),
    #: not batched into one transaction.
    remote: ClassVar[bool] = False

    @abstractmethod
    def _claim(
        self, *, due_by: float, now: float, limit: int, take: Take, mine: Mine
    ) -> list[Opened]:
        """In one transaction, ``take`` each due intent (oldest due first, at most ``limit``).

        Due means pending with ``due_at <= due_by``; sending under a lease that
        expired by ``due_by`` (its owner died); or pending but touched after
        ``now`` plus the clock tolerance (a clock that went back). Only rows
        ``mine`` admits are due. Write the changes ``take`` returns for each;
        answer what it handed out.
        """

    @abstractmethod
    def _holders(self, now: float, mine: Mine) -> list[str]:
        """The owners of ``mine``'s intents under a lease that has not run out."""

    @abstractmethod
    def _unowned(
        self, previous: str | None, unfinished: bool = False
    ) -> list[tuple[int, str, str | None]]:
        """``(id, url, origin)`` of each row of sender ``previous`` (None: of no sender).

        ``unfinished``: only its pending and sending rows (a drain's every pass
        reads these few through the claim indexes, not every row of no sender).
        """

    @abstractmethod
    def _assign(self, changes: list[tuple[int, decide.Changes]], previous: str | None) -> int:
        """Write each row's changes while its sender is still ``previous``; count the rows."""

    @abstractmethod
    def _take_rows(
        self, kind: str, *, mine: Mine, now: float, limit: int, changes: decide.Changes
    ) -> list[IntentRecord]:
        """Write ``changes`` on up to ``limit`` rows of ``sender`` in one transaction; say which.

        ``kind`` ``"settle"``: rows whose settlement is owed by ``now``, oldest
        first; ``"expired"``: expired and indeterminate rows the reconciler may
        be asked about now.
        """

    @abstractmethod
    def _change_row(
        self, intent_id: int, changes: decide.Changes, *, bump: str | None, owed_at: float
    ) -> bool:
        """Write ``changes`` (and one more ``bump``) while ``settle_due_at`` is ``owed_at``.

        The fence of a settlement: a handler's result is recorded only for the
        settlement it was given, never for a newer one owed since (False then).
        """

    @abstractmethod
    def _fenced(self, lease: Lease, changes: decide.Changes, *, durable: bool) -> bool:
        """Write ``changes`` to the leased intent only while ``lease.token`` owns it."""

    @abstractmethod
    def _record(
        self, lease: Lease, attempt: AttemptRecord, changes: decide.Changes, *, durable: bool
    ) -> bool:
        """Like :meth:`_fenced`, also counting the attempt and appending it to its log."""

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
    ) -> bool:
        """One attempt and the state it leads to, accepted only while the lease owns the row.

        ``settle_hold``: the recorder runs a settlement handler (see ``decide.owed``).
        """
        changes = decide.recorded(
            lease,
            attempt,
            state=state,
            anchor=anchor,
            due_at=due_at,
            lease_until=lease_until,
            response=response,
            note=note,
            settle_hold=settle_hold,
        )
        return self._record(lease, attempt, changes, durable=durable)

    def _token(self) -> str:
        """A fresh claim token: proof of one lease, checked by every fenced write."""
        return os.urandom(12).hex()

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
        alive: Callable[[str], bool] = lease_owner_alive,
    ) -> list[Opened]:
        """Atomically lease up to ``limit`` intents that are due and not leased, oldest first.

        With ``sender``, only that sender's intents (and with ``origins``, only
        those addressed to one of them): a drain never sends another client's.
        Intents leased by an owner that ``alive`` says is gone are due at once.
        """
        expires = now + lease_for
        due_by = now if due_by is None else min(due_by, now)

        def take(record: IntentRecord) -> tuple[Opened, decide.Changes]:
            lease = Lease(record.id, self._token(), owner, expires)
            return decide.taken(record, lease, now, decide.claim_anchor(record, now))

        mine = Mine(sender, None if origins is None else tuple(sorted(origins)))
        dead = tuple(owner for owner in self._holders(now, mine) if not alive(owner))
        if dead:
            mine = dataclasses.replace(mine, dead=dead)
        return self._claim(due_by=due_by, now=now, limit=limit, take=take, mine=mine)

    def adopt(
        self,
        *,
        sender: str,
        origins: Collection[str] | None,
        previous: str | None = None,
        unfinished: bool = False,
    ) -> int:
        """Make ``sender`` the sender of the intents of ``previous`` addressed to ``origins``.

        ``previous=None`` adopts intents written before senders were kept (each
        one's origin read from its URL). ``unfinished``: only pending and
        sending ones (what a drain's pass looks for: rows a process of an older
        release wrote since). Answers how many were adopted.
        """
        if origins is None:
            return 0  # a client with no origins of its own has nothing to adopt
        found = self._unowned(previous, unfinished)
        changes = decide.adoptions(found, sender, frozenset(origins))
        return self._assign(changes, previous) if changes else 0

    @abstractmethod
    def _extend(self, lease: Lease, now: float, until: float) -> float | None:
        """Extend the lease to ``until`` unless it already runs longer; the expiry, or None.

        Never shortens it: a heartbeat's renewal that lands after a retry's record
        (which set a longer lease for the sleep) must not cut that lease short.
        """

    def renew(self, lease: Lease, *, now: float, until: float) -> Lease | None:
        expires = self._extend(lease, now, until)
        if expires is None:
            return None
        return Lease(lease.intent_id, lease.token, lease.owner, expires)

    def release(
        self, lease: Lease, *, now: float, due_at: float | None, anchor: float | None
    ) -> bool:
        """Hand an unsent claim back: pending, due at ``due_at`` (default now)."""
        return self._fenced(lease, decide.released(now, due_at, anchor), durable=False)

    def settle(
        self,
        lease: Lease,
        *,
        now: float,
        state: State,
        note: str,
        settle_hold: float | None = None,
    ) -> bool:
        changes = decide.settled(now, state, note, settle_hold)
        return self._fenced(lease, changes, durable=True)

    def claim_settlements(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        hold: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]:
        """Take up to ``limit`` settlements owed by ``now`` for ``hold`` seconds (at least once).

        The records handed back carry the new ``settle_due_at``: the fence their
        ``settlement_done``/``settlement_failed`` must present.
        """
        mine = Mine(sender, None if origins is None else tuple(sorted(origins)))
        taken = decide.settlement_taken(now, hold)
        rows = self._take_rows("settle", mine=mine, now=now, limit=limit, changes=taken)
        return [dataclasses.replace(r, settle_due_at=taken["settle_due_at"]) for r in rows]

    def take_settlement(
        self, *, intent_id: int, owed_at: float, now: float, hold: float
    ) -> float | None:
        """Take one settlement if it is still the one owed at ``owed_at``: its new fence, or None.

        Two callers that read the same owed settlement cannot both take it.
        """
        taken = decide.settlement_taken(now, hold)
        if not self._change_row(intent_id, taken, bump=None, owed_at=owed_at):
            return None
        fence: float = taken["settle_due_at"]
        return fence

    def settlement_done(self, *, intent_id: int, now: float, owed_at: float) -> bool:
        changes = decide.settlement_done(now)
        return self._change_row(intent_id, changes, bump=None, owed_at=owed_at)

    def settlement_failed(
        self, *, intent_id: int, error: str, retry_at: float, owed_at: float
    ) -> bool:
        changes = decide.settlement_failed(error, retry_at)
        return self._change_row(intent_id, changes, bump="settle_attempts", owed_at=owed_at)

    def claim_expired(
        self,
        *,
        sender: str,
        now: float,
        limit: int,
        every: float,
        origins: Collection[str] | None = None,
    ) -> list[IntentRecord]:
        """Take up to ``limit`` expired or indeterminate intents to ask the reconciler about.

        Each is taken once per ``every`` seconds.
        """
        mine = Mine(sender, None if origins is None else tuple(sorted(origins)))
        taken = decide.reconcile_taken(now, every)
        return self._take_rows("expired", mine=mine, now=now, limit=limit, changes=taken)

    def wait_change(self, intent_id: int, timeout: float) -> None:
        """Block until the intent may have changed, or ``timeout`` passes.

        Here: a short sleep, for a caller that polls (20 reads a second at most).
        PostgreSQL overrides it with LISTEN.
        """
        time.sleep(min(max(0.0, timeout), 0.05))

    def export_rows(self) -> Iterator[dict[str, Any]]:
        """Every intent with its attempts, as plain data."""
        return export_rows(self)  # type: ignore[arg-type]  # every subclass is a whole Store
