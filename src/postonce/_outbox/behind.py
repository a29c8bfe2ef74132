"""Write-behind for the blocking client: the record of a 2xx answer leaves the hot path.

A flow marks a store call ``behind`` when nobody waits for its result: the
record of a final 2xx answer. Such a call is queued here. The caller's next
store call (usually the next intent's write-ahead) takes the queue along in
its own transaction, so a busy caller pays one commit per intent, not two.
If no call comes within ``delay`` (20 ms), a thread of the client's own
(``postonce-outbox-behind``, which otherwise sleeps) commits the queue.

Why losing one is safe: until it commits, the intent is ``sending`` under a
lease. If the process dies in that window, the lease expires and the drain
sends the same key again, and the provider replays the stored answer. That is
the repair a ``synchronous=NORMAL`` commit already relies on after a power cut;
write-behind only widens the window from "the last few commits before a power
cut" to "the last ``delay`` before a crash".

Read-your-writes holds within the process: every other call first commits what
is queued, in order, under the same lock, so a second ``post_once`` of the same
intent finds it finished. :meth:`flush` (called by ``Client.outbox`` and
``Client.close``) commits the queue at once.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any

from .base import Store, lost_behind, run_calls

__all__ = ["WriteBehind"]

logger = logging.getLogger("postonce")

Call = tuple[str, dict[str, Any]]

_LIVE: weakref.WeakSet[WriteBehind] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    """At interpreter exit, commit what unclosed clients still hold."""
    for writer in list(_LIVE):
        writer.flush()


class WriteBehind:
    """Runs a store's calls in order; calls nobody waits for are committed behind the caller."""

    def __init__(self, store: Store, *, delay: float = 0.02) -> None:
        self.store = store
        self.delay = delay  # longest a queued call waits for a ride before the thread commits it
        self._queued_at = 0.0  # when the oldest queued call was queued (monotonic)
        self._queue: list[Call] = []
        # Queued or being committed: while nonzero, calls wait their turn (read-your-writes).
        self._unsettled = 0
        self._wake = threading.Condition()
        self._run_lock = threading.Lock()  # held while queued calls run: keeps them in order
        self._thread: threading.Thread | None = None
        self._closed = False
        _LIVE.add(self)

    def defer(self, method: str, kwargs: dict[str, Any]) -> None:
        """Queue a call whose result nobody needs; it commits within moments."""
        with self._wake:
            if self._closed:
                closed = True
            else:
                closed = False
                if not self._queue:
                    self._queued_at = time.monotonic()
                self._queue.append((method, kwargs))
                self._unsettled += 1
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._loop, name="postonce-outbox-behind", daemon=True
                    )
                    self._thread.start()
        if closed:  # after close: nothing will flush it, so run it now
            self.call(method, kwargs)

    def call(self, method: str, kwargs: dict[str, Any]) -> Any:
        """Run a call after everything queued before it; return its result or raise.

        With nothing queued or being committed, the call goes straight to the
        store, so threads sharing a client (a drain's workers) still reach a
        pooled store in parallel.
        """
        if not self._unsettled:
            return getattr(self.store, method)(**kwargs)
        with self._run_lock:
            queued = self._take()
            if not queued:
                return getattr(self.store, method)(**kwargs)
            try:
                ok, result = self._run([*queued, (method, kwargs)], deferred=len(queued))[-1]
            finally:
                self._settled(len(queued))
        if not ok:
            raise result
        return result

    def flush(self) -> None:
        """Commit every queued call now."""
        with self._run_lock:
            queued = self._take()
            if queued:
                try:
                    self._run(queued, deferred=len(queued))
                finally:
                    self._settled(len(queued))

    def _settled(self, count: int) -> None:
        with self._wake:
            self._unsettled -= count

    def _take(self) -> list[Call]:
        with self._wake:
            queued, self._queue = self._queue, []
        return queued

    def _run(self, calls: list[Call], *, deferred: int) -> list[tuple[bool, Any]]:
        """Run calls in one transaction where the store can; the first ``deferred`` were queued."""
        results = run_calls(self.store, calls)
        for (method, _), (ok, result) in zip(calls[:deferred], results, strict=False):
            if not ok:
                lost_behind(method, result)
        return results

    def _loop(self) -> None:
        """Commit what waited ``delay`` without a ride; otherwise sleep."""
        while True:
            with self._wake:
                if self._closed:
                    return  # close() commits the rest
                self._wake.wait(self.delay)
                stale = bool(self._queue) and time.monotonic() - self._queued_at >= self.delay
            if not stale:
                continue
            try:
                self.flush()
            except Exception:  # pragma: no cover - _run catches store errors
                logger.exception("outbox: the write-behind thread failed")

    def close(self) -> None:
        """Commit what is queued and stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        self.flush()
        _LIVE.discard(self)
