"""A store's own thread, for async callers: the event loop never blocks on SQLite.

One writer thread per outbox takes every call queued while it was busy and
runs them in ONE transaction (group commit): 64 concurrent intents cost one
fsync, not 64. A caller's ``post_once`` still does not send before the
transaction holding its own intent row has committed: it waits for its
ticket, which is settled only after the commit.

The thread is named ``postonce-outbox-writer``; it is the thread that commits
your intents. Works under asyncio and trio (through anyio).

A store whose calls are each their own transaction on a pooled connection
(PostgreSQL: ``StoreBase.remote``) is not funnelled into one transaction: a
batch there would run every call in a savepoint, several round trips each,
one after the other. Its calls run side by side instead, on
``parallel_calls`` threads (also named ``postonce-outbox-writer``; PostgreSQL:
one fewer than its pooled connections, so a lease heartbeat always finds one),
each taking its own path (a record is one round trip), and the store's own
group commit joins the writes that meet.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import anyio
import sniffio

from .._exceptions import OutboxError
from .base import Store, run_calls

__all__ = ["StoreThread", "Ticket", "loop_notifier"]

logger = logging.getLogger("postonce")


_BATCH_MAX = 512


def loop_notifier() -> Callable[[Callable[[], object]], object]:
    """A thread-safe way to run a callback on the current event loop."""
    return _current_loop()[0]


def _current_loop() -> tuple[Callable[[Callable[[], object]], object], Any]:
    """The current event loop's thread-safe notifier, and the loop itself on asyncio (else None)."""
    if sniffio.current_async_library() == "trio":
        import trio

        return trio.lowlevel.current_trio_token().run_sync_soon, None
    import asyncio

    loop = asyncio.get_running_loop()
    return loop.call_soon_threadsafe, loop


def _wake(tickets: list[Ticket]) -> None:
    for ticket in tickets:
        ticket.settle()


def _wake_on(notify: Callable[[Callable[[], object]], object], tickets: list[Ticket]) -> None:
    """Wake ``tickets``' callers on their loop, from a store thread.

    A loop that has closed meanwhile (its ``asyncio.run`` ended with the call
    still queued) raises RuntimeError: nobody is left there to wake, and the
    thread must go on serving the calls of other loops.
    """
    try:
        notify(functools.partial(_wake, tickets))
    except RuntimeError:  # trio's RunFinishedError is one too
        logger.debug("a store call finished after its event loop closed")


class Ticket:
    """One queued store call; ``await ticket.wait()`` gives its result or raises its error.

    It is settled on its caller's event loop (the writer hands :meth:`settle`
    to ``notify``), so waiting and settling never race. On asyncio a waiter
    blocks on a bare future of its loop, as ``asyncio.Event`` does inside,
    without anyio's event around it (~15 Python calls a store call); on trio,
    on an ``anyio.Event``. Each wait makes its own: a wait cancelled (its
    future cancelled with it) can wait again, shielded, for the same call.
    One task waits on a ticket at a time (its caller): a second wait begun
    while one is under way would take its place, and the first never wake.
    """

    __slots__ = ("_loop", "_waiter", "kwargs", "method", "notify", "ok", "result", "settled")

    def __init__(
        self,
        method: str,
        kwargs: dict[str, Any],
        notify: Callable[[Callable[[], object]], object],
        loop: Any = None,
    ) -> None:
        self.method, self.kwargs, self.notify, self._loop = method, kwargs, notify, loop
        self.ok = False
        self.result: Any = None
        self.settled = False
        self._waiter: Any = None  # the future or event the caller waits on, if it waits

    def settle(self) -> None:
        """Wake the caller (on its loop): ``ok`` and ``result`` are final."""
        self.settled = True
        waiter = self._waiter
        if waiter is None:
            return
        if self._loop is None:
            waiter.set()
        elif not waiter.done():  # not cancelled meanwhile
            waiter.set_result(None)

    async def wait(self) -> Any:
        while not self.settled:
            if self._loop is None:
                event = self._waiter = anyio.Event()
                await event.wait()
            else:
                future = self._waiter = self._loop.create_future()
                await future
        if not self.ok:
            raise self.result
        return self.result


class StoreThread:
    """Runs a store's calls on one thread of its own, batching writes when it can."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: Side by side on a remote store's connections; else one writer's batches.
        self._side_by_side = (
            int(getattr(store, "parallel_calls", 1)) if getattr(store, "remote", False) else 0
        )
        self._workers: list[threading.Thread] = []
        self._calls: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._closed = False
        self._queue: queue.SimpleQueue[list[Ticket] | None] = queue.SimpleQueue()
        self._pending: dict[Callable[[Callable[[], object]], object], list[Ticket]] = {}
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # Transactions run; group commit shows as batches < calls (on a remote
        # store every call is its own: its group commit is the store's).
        self.batches = 0
        self.calls = 0

    def submit(self, method: str, kwargs: dict[str, Any]) -> Ticket:
        """Queue a call from async code; the ticket settles after its commit.

        Calls submitted in one turn of the event loop reach the writer
        together, so they can share one transaction: the answers of many
        intents commit in one group, and each caller resumes after it.
        """
        notify, loop = _current_loop()
        ticket = Ticket(method, kwargs, notify, loop)
        if self._side_by_side:
            self._alone(ticket)
            return ticket
        with self._start_lock:
            if self._closed:
                self._refuse(ticket)
                return ticket
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="postonce-outbox-writer", daemon=True
                )
                self._thread.start()
            pending = self._pending.setdefault(notify, [])
            pending.append(ticket)
            first = len(pending) == 1
        if first:
            notify(lambda: self._flush(notify))
        return ticket

    def _flush(self, notify: Callable[[Callable[[], object]], object]) -> None:
        """Hand this loop turn's calls to the writer, all at once."""
        with self._start_lock:
            tickets = self._pending.pop(notify, [])
        if tickets:
            self._queue.put(tickets)

    def _alone(self, ticket: Ticket) -> None:
        """Run one call on a worker (a remote store); its caller is woken once it is done."""
        with self._start_lock:
            if self._closed:
                self._refuse(ticket)
                return
            if not self._workers:
                # Daemon threads, as the one writer: a process never waits on a stuck call.
                self._workers = [
                    threading.Thread(target=self._serve, name="postonce-outbox-writer", daemon=True)
                    for _ in range(self._side_by_side)
                ]
                for worker in self._workers:
                    worker.start()
            self.batches += 1
            self.calls += 1
            self._calls.put(ticket)

    @staticmethod
    def _refuse(ticket: Ticket) -> None:
        """Answer a call made after :meth:`close`: nothing runs it any more."""
        ticket.result = OutboxError("the outbox's store thread is closed")
        _wake_on(ticket.notify, [ticket])

    def _serve(self) -> None:
        while (ticket := self._calls.get()) is not None:
            self._run_one(ticket)

    def _run_one(self, ticket: Ticket) -> None:
        # The call's own path, as a blocking caller takes it: never a batch of one.
        try:
            ticket.result = getattr(self.store, ticket.method)(**ticket.kwargs)
            ticket.ok = True
        except Exception as exc:  # typed as for a blocking caller (OutboxError, IntentConflict)
            ticket.result = exc
        except BaseException as exc:  # never leave the caller waiting
            ticket.result = OutboxError(f"the outbox call {ticket.method} ended in {exc!r}")
            ticket.result.__cause__ = exc
        finally:
            _wake_on(ticket.notify, [ticket])

    async def call(self, method: str, kwargs: dict[str, Any]) -> Any:
        return await self.submit(method, kwargs).wait()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = list(first)
            stop = False
            while len(batch) < _BATCH_MAX:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.extend(more)
            self.batches += 1
            self.calls += len(batch)
            results = run_calls(self.store, [(t.method, t.kwargs) for t in batch])
            # One wake-up per event loop for the whole batch, not one per call.
            by_loop: dict[Callable[[Callable[[], object]], object], list[Ticket]] = {}
            for ticket, (ok, result) in zip(batch, results, strict=True):
                ticket.ok, ticket.result = ok, result
                by_loop.setdefault(ticket.notify, []).append(ticket)
            for notify, tickets in by_loop.items():
                _wake_on(notify, tickets)
            if stop:
                return

    def close(self) -> None:
        """Finish the queued calls, then stop the thread (or the workers).

        Calls submitted but not yet handed to the writer (their loop turn has
        not ended) are handed over first; a call submitted after this is
        refused with OutboxError.
        """
        with self._start_lock:
            self._closed = True
            workers, self._workers = self._workers, []
            for _ in workers:
                self._calls.put(None)  # after every call queued so far
            thread, self._thread = self._thread, None
            for tickets in self._pending.values():
                self._queue.put(tickets)
            self._pending.clear()
            if thread is not None:
                self._queue.put(None)
        for worker in workers:
            worker.join()
        if thread is not None:
            thread.join()
