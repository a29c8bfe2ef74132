"""Gentle to a recovering provider: a drain's pauses and rate, per origin.

After an outage every intent of the last hour is due at once, and a provider
that has just come back is the one most likely to rate-limit. A ``429`` or
``503`` answer with ``Retry-After`` (or ``retry-after-ms``) asks the client to
leave the provider alone for that long: a drain honours it for the whole
*origin* (``scheme://host:port``), not only for the intent it answered. Its
other due intents to that origin are not claimed, and those already claimed
but not yet sent are handed back due when the pause ends; sends already in
flight go on. A pause is capped by the policy's ``retry_after_max``, as a
retry's wait is, and each intent's horizon is checked again before its send.

A drain can also be given a rate: at most ``rate`` sends a second to each
origin, spaced evenly. A flow takes its slot before it waits for a send turn
(so claims do not all queue for turns at once), and keeps its distance from
the send before it once it has the turn: flows that waited out a stall past
their slots do not send together when it ends.

An intent stored without an origin (written before origins were kept) is
paced by the origin of its URL.

:func:`pause_asked` decides; :class:`Pace` keeps one drain's pauses and send
slots (thread-safe: a sync drain's flows run on threads). Each drain process
learns a pause from its own answers.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping

from ._intent import IntentRecord
from ._policy import retry_after
from ._sender import origin_of

__all__ = ["PAUSING", "Pace", "pace_origin", "pause_asked"]

logger = logging.getLogger("postonce")

#: The answers whose ``Retry-After`` speaks for the whole origin: too many
#: requests (RFC 6585 §4) and unavailable (RFC 9110 §15.6.4).
PAUSING = frozenset({429, 503})


def pause_asked(status: int, headers: Mapping[str, str], now: float, cap: float) -> float | None:
    """Until when an answer asks its origin to be left alone, or None.

    A 429 or 503 with a readable, positive ``Retry-After`` (or ``retry-after-ms``):
    ``now`` plus that wait, at most ``cap`` seconds.
    """
    if status not in PAUSING:
        return None
    wait = retry_after(headers, now)
    if wait is None or not wait > 0:
        return None
    return now + min(wait, cap)


def pace_origin(record: IntentRecord) -> str | None:
    """The origin an intent is paced by: its stored one, else its URL's."""
    return record.origin or origin_of(record.url)


class Pace:
    """One drain's pauses and send slots per origin (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float], cap: float, rate: float | None = None) -> None:
        if rate is not None and not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a positive number of sends a second, not {rate!r}")
        self._clock = clock
        self._cap = cap
        self._spacing = None if rate is None else 1.0 / rate
        self._paused: dict[str, float] = {}
        self._next_slot: dict[str, float] = {}
        self._next_send: dict[str, float] = {}  # (slots are taken before the turn, sends at it)
        self._lock = threading.Lock()

    def heard(self, origin: str, status: int, headers: Mapping[str, str]) -> None:
        """An answer from ``origin``: a pause it asks for starts now (the longest one wins)."""
        now = self._clock()
        until = pause_asked(status, headers, now, self._cap)
        if until is None:
            return
        with self._lock:
            if until <= self._paused.get(origin, 0.0):
                return
            self._paused[origin] = until
        logger.warning(
            "drain: %s answered %d and asked for %.3g s; its due intents wait until then",
            origin,
            status,
            until - now,
            extra={"origin": origin, "status": status},
        )

    def paused_until(self, origin: str | None) -> float | None:
        """When a pause of ``origin`` ends, or None when it is not paused."""
        if origin is None:
            return None
        with self._lock:
            until = self._paused.get(origin)
        return until if until is not None and until > self._clock() else None

    def paused(self) -> frozenset[str]:
        """The origins paused now."""
        now = self._clock()
        with self._lock:
            return frozenset(origin for origin, until in self._paused.items() if until > now)

    def hearing(self, origin: str | None) -> Callable[[int, Mapping[str, str]], None] | None:
        """What a drain's turn calls with each answer from ``origin`` (None: no origin to pause)."""
        if origin is None:
            return None
        return lambda status, headers: self.heard(origin, status, headers)

    def slot(self, origin: str | None) -> float:
        """Seconds to wait before the next send to ``origin`` at the rate (taken by this call).

        0 for an origin paused now, and no slot taken: its claims go back at once.
        """
        return self._take(self._next_slot, origin)

    def gap(self, origin: str | None) -> float:
        """Seconds to wait, once a flow has its send turn, so that its send to ``origin``
        follows the one before it by at least ``1 / rate`` (this send's time is taken).

        0 for an origin paused now, and nothing taken, as for :meth:`slot`.
        """
        return self._take(self._next_send, origin)

    def _take(self, times: dict[str, float], origin: str | None) -> float:
        """The wait for the next of ``times`` (one ``1 / rate`` apart for each origin), taken."""
        if self._spacing is None or origin is None:
            return 0.0
        now = self._clock()
        with self._lock:
            if self._paused.get(origin, 0.0) > now:
                return 0.0
            at = max(now, times.get(origin, now))
            times[origin] = at + self._spacing
        return at - now
