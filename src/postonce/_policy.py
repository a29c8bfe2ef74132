"""Retry policy: backoff waits, Retry-After and the retry horizon. Pure functions."""

from __future__ import annotations

import difflib
import email.utils
import math
import re
from collections.abc import Mapping
from datetime import timezone
from typing import TYPE_CHECKING, Any

import tenacity
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ._exceptions import ConfigurationError
from ._intent import Outcome
from .providers import Provider

__all__ = ["RetryPolicy", "backoff", "horizon_at", "policy_problem", "retry_after"]

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

    if not TYPE_CHECKING:  # mypy checks calls against the fields (pydantic's plugin)

        def __init__(self, **fields: Any) -> None:
            """Validate the fields; a refusal is a ConfigurationError naming field and rule."""
            try:
                super().__init__(**fields)
            except ValidationError as exc:
                # Not chained: the cause is pydantic's dump of the same facts, reworded here.
                raise ConfigurationError(policy_problem(exc)) from None

    @model_validator(mode="after")
    def _ordered(self) -> RetryPolicy:
        for initial, most in (("wait_initial", "wait_max"), ("in_flight_initial", "in_flight_max")):
            if getattr(self, initial) > getattr(self, most):
                raise ValueError(
                    f"{initial}={getattr(self, initial)!r} is greater than "
                    f"{most}={getattr(self, most)!r}: an initial wait must not exceed its maximum"
                )
        return self


#: Words for a RetryPolicy field that difflib cannot find: what they likely mean.
_FIELD_ALIASES = {
    "retries": "attempts",
    "max_retries": "attempts",
    "max_attempts": "attempts",
    "tries": "attempts",
    "deadline": "timeout",
    "total_timeout": "timeout",
    "backoff": "wait_initial",
    "multiplier": "wait_initial",
    "max_wait": "wait_max",
    "exp_base": "wait_exp_base",
}


#: pydantic's error types for a bound, as words and the bound's name in ``ctx``.
_BOUNDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("greater than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}
#: pydantic's error types for a value of the wrong kind, as the rule it broke.
_KINDS = {
    "finite_number": "must be a finite number",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
}


def _rule(error: Mapping[str, Any]) -> str:
    """One pydantic error as the rule the value broke."""
    kind, ctx = error["type"], error.get("ctx") or {}
    given = error.get("input")
    if isinstance(given, float) and math.isnan(given):
        return "must be a number, not NaN"
    if kind in _BOUNDS:
        words, name = _BOUNDS[kind]
        bound = ctx.get(name)
        return (
            f"must be {words} {bound:g}" if isinstance(bound, float) else f"must be {words} {bound}"
        )
    return _KINDS.get(kind) or str(error.get("msg", kind))


def policy_problem(exc: ValidationError) -> str:
    """A RetryPolicy ValidationError as one sentence a field at a time, without pydantic's dump."""
    fields = tuple(RetryPolicy.model_fields)
    said = []
    for error in exc.errors(include_url=False):
        loc = error.get("loc") or ()
        name = str(loc[0]) if loc else ""
        if error["type"] == "extra_forbidden":
            meant = _FIELD_ALIASES.get(name.lower()) or next(
                iter(difflib.get_close_matches(name.lower(), fields, n=1, cutoff=0.6)), None
            )
            hint = f" (did you mean {meant}?)" if meant else ""
            said.append(f"it has no field {name!r}{hint}; its fields are {', '.join(fields)}")
        elif not name:  # a rule across fields (see _ordered): its message says it all
            context = error.get("ctx") or {}
            said.append(str(context.get("error", error.get("msg"))))
        else:
            said.append(f"{name}={error.get('input')!r} {_rule(error)}")
    # dict.fromkeys: a union field (timeout: float | None) can report one value twice.
    return "RetryPolicy: " + "; ".join(dict.fromkeys(said))


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
