"""The heartbeat: leases of sends in flight are renewed, so a live send is never taken over.

A lease is short (15 s by default) so that a dead host's intents are taken over
quickly; a send may take longer. While a send is in flight its lease is renewed
every ``every`` seconds (5 s by default) by one thread per client
(``postonce-heartbeat``), straight on the store (every store is thread-safe).
A renewal that finds the lease gone (another owner took it over after this
process stalled) is logged: fencing keeps the late answer from being recorded.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ._intent import Lease

__all__ = ["Heartbeat"]

logger = logging.getLogger("postonce")


class Heartbeat:
    """Renews held leases every ``every`` seconds to ``lease_for`` ahead, from its own thread."""

    def __init__(self, every: float, lease_for: float, clock: Callable[[], float]) -> None:
        self.every = every
        self.lease_for = lease_for
        self._clock = clock
        self._held: dict[int, tuple[Any, Lease]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False  # closed with its client: never started again
        self.renewals = 0  # renewals made, for tests and curiosity

    def holding(self, store: Any, lease: Lease | None) -> _Held:
        """Keep ``lease`` alive on ``store`` for the duration of a ``with`` block.

        A plain context manager object, not a generator one: it is entered
        around every send.
        """
        return _Held(self, store, lease)

    def _hold(self, store: Any, lease: Lease) -> int:
        key = next(self._ids)
        with self._lock:
            self._held[key] = (store, lease)
            # None, or not running: a child forked after a send inherits a Thread
            # object whose thread did not come along.
            if not self._closed and (self._thread is None or not self._thread.is_alive()):
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name="postonce-heartbeat", daemon=True
                )
                self._thread.start()
        return key

    def _let_go(self, key: int) -> None:
        with self._lock:
            self._held.pop(key, None)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                held = list(self._held.items())
            for key, (store, lease) in held:
                now = self._clock()
                try:
                    renewed = store.renew(lease, now=now, until=now + self.lease_for)
                except Exception as exc:
                    logger.warning("heartbeat: renewing a lease failed (%s); will try again", exc)
                    continue
                with self._lock:
                    if key not in self._held:
                        continue  # the send ended meanwhile: its record took the lease
                    if renewed is None:
                        del self._held[key]
                        logger.warning(
                            "heartbeat: the lease of intent %d was taken over by another "
                            "owner; this send's answer will not be recorded",
                            lease.intent_id,
                        )
                    else:
                        self._held[key] = (store, renewed)
                        self.renewals += 1

    def close(self) -> None:
        """Stop the thread for good (held leases are left to expire)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._closed = True
            self._stop.set()
        if thread is not None and thread.is_alive():
            thread.join()


class _Held:
    """One lease held by a :class:`Heartbeat` while its ``with`` block runs."""

    __slots__ = ("_heartbeat", "_key", "_lease", "_store")

    def __init__(self, heartbeat: Heartbeat, store: Any, lease: Lease | None) -> None:
        self._heartbeat, self._store, self._lease = heartbeat, store, lease
        self._key: int | None = None

    def __enter__(self) -> None:
        if self._key is not None:
            raise RuntimeError("a holding() block is entered once; call holding() again")
        if self._lease is not None:
            self._key = self._heartbeat._hold(self._store, self._lease)

    def __exit__(self, *exc_info: object) -> None:
        if self._key is not None:
            self._heartbeat._let_go(self._key)
            self._key = None
