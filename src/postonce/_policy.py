"""Retry policy: backoff waits, Retry-After and the retry horizon. Pure functions."""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from datetime import timezone

import tenacity
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ._intent import Outcome
from .providers import Provider

__all__ = ["RetryPolicy", "backoff", "horizon_at", "retry_after"]

_SECONDS = re.compile(r"\s*(\d{1,12})\s*")
_MILLIS = re.compile(r"\s*(\d{1,15}(?:\.\d{1,6})?)\s*")
_DATE_MAX = 64


class RetryPolicy(BaseModel):
    """How hard and how long to retry. Set it on the client; override it per call.

    The foreground call stops after ``attempts`` sends or ``timeout`` seconds,
    whichever comes first, and leaves the intent pending for the drain. Sends
    answered "still in flight" (e.g. 409) do not count as attempts: only
    ``timeout`` bounds the wait for the first request to finish. Waits
    are exponential with full jitter (tenacity's ``wait_random_exponential``);
    a ``Retry-After`` or ``retry-after-ms`` answer is honoured up to
    ``retry_after_max``. An in-flight answer (e.g. 409) waits on the shorter
    ``in_flight_*`` scale: the first request is still running.

    ``horizon_margin`` is the share of the provider's retention kept back as a
    safety margin: with Stripe's 24 hours and the default 0.1, no retry is sent
    later than 21.6 hours after the first send that may have been delivered.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=5, ge=1)
    timeout: float | None = Field(default=60.0, gt=0)
    wait_initial: float = Field(default=0.5, ge=0)
    wait_max: float = Field(default=8.0, ge=0)
    wait_exp_base: float = Field(default=2.0, ge=1)
    in_flight_initial: float = Field(default=0.25, ge=0)
    in_flight_max: float = Field(default=2.0, ge=0)
    retry_after_max: float = Field(default=60.0, ge=0)
    horizon_margin: float = Field(default=0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        if self.wait_initial > self.wait_max or self.in_flight_initial > self.in_flight_max:
            raise ValueError("an initial wait is greater than its maximum")
        return self


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asked us to wait, or None when it asked nothing readable.

    Reads ``retry-after-ms`` first, then ``Retry-After`` as delay-seconds or an
    HTTP-date. Anything else (garbage, absurd lengths) is ignored, never trusted.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None and (m := _MILLIS.fullmatch(millis)):
        return float(m.group(1)) / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    if m := _SECONDS.fullmatch(value):
        return float(m.group(1))
    if len(value) > _DATE_MAX:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delay = when.timestamp() - now
    return max(0.0, delay) if math.isfinite(delay) else None


# tenacity's wait strategies read only the attempt number from the call state.
_RETRYING = tenacity.Retrying()


def _tenacity_wait(strategy: tenacity.wait.wait_base, attempt: int) -> float:
    state = tenacity.RetryCallState(_RETRYING, fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(strategy(state))


class _Testing:
    """The switch behind ``postonce.testing.set_testing`` (process-wide)."""

    on = False
    attempts: int | None = None  # with on: the most sends a foreground call makes


TESTING = _Testing()


def backoff(
    policy: RetryPolicy,
    outcome: Outcome,
    attempt: int,
    headers: Mapping[str, str],
    now: float,
) -> float:
    """The wait before attempt ``attempt + 1``: Retry-After when given, else jittered backoff.

    Under ``postonce.testing.set_testing()`` there is no wait, but for an
    in-flight answer, which waits at most 10 ms: the first request is still
    running, and a zero wait would only spin.
    """
    if TESTING.on:
        return 0.01 if outcome is Outcome.IN_PROGRESS else 0.0
    hinted = retry_after(headers, now)
    if hinted is not None:
        return min(hinted, policy.retry_after_max)
    if outcome is Outcome.IN_PROGRESS:
        strategy = tenacity.wait_random_exponential(
            multiplier=policy.in_flight_initial, max=policy.in_flight_max
        )
    else:
        strategy = tenacity.wait_random_exponential(
            multiplier=policy.wait_initial, max=policy.wait_max, exp_base=policy.wait_exp_base
        )
    return _tenacity_wait(strategy, attempt)


def settle_backoff(failures: int) -> float:
    """The wait before a settlement handler that raised ``failures`` times is called again.

    Jittered exponential from 1 s, at most 5 minutes (tenacity's strategy); a
    handler's failure never changes the intent, so there is no horizon here.
    """
    if TESTING.on:
        return 0.0
    strategy = tenacity.wait_random_exponential(multiplier=1.0, max=300.0)
    return _tenacity_wait(strategy, failures + 1)


def horizon_at(anchor: float, provider: Provider, policy: RetryPolicy) -> float:
    """The last moment a retry may be sent, given the first possibly-delivered send."""
    return anchor + provider.retention.total_seconds() * (1.0 - policy.horizon_margin)
