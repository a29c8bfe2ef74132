"""OpenTelemetry spans and metrics from postonce's hooks: ``pip install 'postonce[otel]'``.

::

    from postonce.otel import otel_hooks

    client = postonce.Client(outbox="outbox.sqlite3", hooks=otel_hooks())

:func:`otel_hooks` returns a :class:`postonce.Hooks` that turns what happens
to intents into OpenTelemetry data:

* one span (``postonce.intent``, kind ``CLIENT``) per intent per call: from
  the moment the call (or a drain claim) holds the intent's lease to the
  moment it stops working on it. Each attempt, scheduled retry, replay,
  give-up and expiry is an event on it.
* four instruments: the counters ``postonce.attempts``,
  ``postonce.intents.ended`` and ``postonce.retries.scheduled``, and the
  histogram ``postonce.attempt.duration`` (seconds).

Span status. A span is ``ERROR`` when the call raised (``EndDetail.error``)
or the intent ended ``failed`` (a final non-2xx answer, or a refused key).
``IntentPending`` is not an error: the intent is durable and left for the
drain (``postonce.state`` is ``pending``, ``postonce.error`` names it).
Otherwise the status stays ``UNSET``.

Context. The span is current only while each HTTP send is in flight (the
``around_send`` hook, entered and left by the client's own loop on the
sending thread or task), so the spans an httpx instrumentation such as
opentelemetry-instrumentation-httpx makes for each attempt are its children;
it never leaks into the caller's code. Its own parent is whatever span is
current where the call is made, so wrapping a call in a span of your own
groups everything under it.

The outbox write-ahead (the commit of the intent and its lease before the
first send) is the event ``write_ahead`` on the span, with
its duration in seconds as ``postonce.outbox.duration``.

Importing :mod:`postonce` never imports OpenTelemetry; only this module does.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised with the extra missing
    raise ImportError(
        "postonce.otel needs the OpenTelemetry API: pip install 'postonce[otel]'"
    ) from exc

from ._intent import State
from ._observe import (
    AttemptDetail,
    EndDetail,
    ExpiryDetail,
    GiveUpDetail,
    Hooks,
    ReplayDetail,
    RetryDetail,
    SendDetail,
    StartDetail,
)
from ._version import __version__

__all__ = ["SPAN_NAME", "otel_hooks"]

logger = logging.getLogger("postonce")

#: The name of the span that covers one call's work on one intent.
SPAN_NAME = "postonce.intent"

_NAME = "postonce"


@dataclass(slots=True)
class _Open:
    """A span in progress, and what EndDetail does not carry but its metrics need."""

    span: Span
    provider: str
    drain: bool
    last_status: int | None = None


class _Recorder:
    """The hooks' state: the open spans by (intent, key), and the instruments."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
    ) -> None:
        self.tracer = trace.get_tracer(_NAME, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_NAME, __version__, meter_provider=meter_provider)
        self.attempts = meter.create_counter(
            "postonce.attempts", unit="{attempt}", description="Sends of an intent's request."
        )
        self.ended = meter.create_counter(
            "postonce.intents.ended",
            unit="{intent}",
            description="Calls and drain claims that stopped working on an intent, by state.",
        )
        self.retries = meter.create_counter(
            "postonce.retries.scheduled",
            unit="{retry}",
            description="Retries of the same key: in the foreground, or left to the drain.",
        )
        self.duration = meter.create_histogram(
            "postonce.attempt.duration", unit="s", description="How long one send took."
        )
        # Several calls (threads, tasks, a drain's workers) share one Hooks: one lock.
        self._lock = threading.Lock()
        # A list per intent: two claims of one intent may overlap in one process
        # (a take-over after a lease ran out); they end in the order they started.
        self._open: dict[tuple[str, str], list[_Open]] = {}

    def _current(self, intent: str, key: str) -> _Open | None:
        with self._lock:
            stack = self._open.get((intent, key))
            return stack[-1] if stack else None

    def around_send(self, d: SendDetail) -> AbstractContextManager[object]:
        """The intent's span made current for one send (the parent of the send's own spans)."""
        with self._lock:
            stack = self._open.get((d.intent, d.key))
            if not stack:
                # A resumed intent sends with its stored key, not the one the call minted.
                stack = next((v for (i, _), v in reversed(self._open.items()) if i == d.intent), [])
            opened = stack[-1] if stack else None
        if opened is None:
            return nullcontext()
        if d.number == 1 and d.outbox_seconds > 0:
            opened.span.add_event("write_ahead", {"postonce.outbox.duration": d.outbox_seconds})
        return trace.use_span(
            opened.span, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    def on_start(self, d: StartDetail) -> None:
        span = self.tracer.start_span(
            SPAN_NAME,
            kind=SpanKind.CLIENT,
            attributes={
                "postonce.intent": d.intent,
                "postonce.key": d.key,
                "postonce.provider": d.provider,
                "postonce.drain": d.drain,
                "postonce.prior_attempts": d.attempts,
            },
        )
        with self._lock:
            self._open.setdefault((d.intent, d.key), []).append(_Open(span, d.provider, d.drain))

    def on_attempt(self, d: AttemptDetail) -> None:
        attributes: dict[str, str | int | float | bool] = {
            "postonce.attempt": d.attempt,
            "postonce.outcome": d.outcome.value,
            "postonce.duration": d.duration,
            "postonce.replayed": d.replayed,
            "postonce.state": d.state.value,
        }
        if d.status is not None:
            attributes["http.response.status_code"] = d.status
        if d.error is not None:
            attributes["error.type"] = d.error
        current = self._current(d.intent, d.key)
        if current is not None:
            current.last_status = d.status
            current.span.add_event("attempt", attributes)
        labels = {"postonce.outcome": d.outcome.value, "postonce.provider": d.provider}
        self.attempts.add(1, labels)
        # A wall clock stepped back can make a duration negative; a histogram takes none.
        self.duration.record(max(0.0, d.duration), labels)

    def on_retry_scheduled(self, d: RetryDetail) -> None:
        current = self._current(d.intent, d.key)
        if current is not None:
            current.span.add_event(
                "retry_scheduled",
                {
                    "postonce.attempt": d.attempt,
                    "postonce.wait": d.wait,
                    "postonce.due_at": d.due_at,
                    "postonce.in_foreground": d.in_foreground,
                    "postonce.reason": d.reason,
                },
            )
        self.retries.add(1, {"postonce.in_foreground": d.in_foreground})

    def on_replayed(self, d: ReplayDetail) -> None:
        current = self._current(d.intent, d.key)
        if current is not None:
            current.span.add_event(
                "replayed", {"postonce.attempt": d.attempt, "http.response.status_code": d.status}
            )

    def on_give_up(self, d: GiveUpDetail) -> None:
        current = self._current(d.intent, d.key)
        if current is not None:
            attributes: dict[str, str | int | float] = {
                "postonce.attempts": d.attempts,
                "postonce.reason": d.reason,
            }
            if d.due_at is not None:
                attributes["postonce.due_at"] = d.due_at
            current.span.add_event("give_up", attributes)

    def on_expired(self, d: ExpiryDetail) -> None:
        current = self._current(d.intent, d.key)
        if current is not None:
            current.span.add_event("expired", {"postonce.reason": d.reason})

    def on_end(self, d: EndDetail) -> None:
        with self._lock:
            stack = self._open.get((d.intent, d.key))
            opened = stack.pop(0) if stack else None
            if stack == []:
                del self._open[(d.intent, d.key)]
        state = d.state.value if d.state is not None else "unknown"
        labels: dict[str, str | bool] = {
            "postonce.state": state,
            "postonce.provider": d.provider,
            "postonce.drain": d.drain,
        }
        self.ended.add(1, labels)
        if opened is None:
            # The flow always pairs them; a Hooks shared after a call began could miss one.
            logger.debug("postonce.otel: no span open for intent %r (key %s)", d.intent, d.key)
            return
        span = opened.span
        if d.state is not None:
            span.set_attribute("postonce.state", d.state.value)
        span.set_attribute("postonce.attempts", d.attempts)
        if d.error is not None:
            span.set_attribute("postonce.error", d.error)
        if d.error is not None and d.state is not State.PENDING:
            span.set_attribute("error.type", d.error)
            span.set_status(Status(StatusCode.ERROR, d.error))
        elif d.state is State.FAILED:
            status = opened.last_status
            span.set_attribute("error.type", str(status) if status is not None else "failed")
            span.set_status(
                Status(StatusCode.ERROR, f"failed: HTTP {status}" if status else "failed")
            )
        span.end()


def otel_hooks(
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Hooks:
    """Hooks that record spans and metrics for every call of the clients they are given to.

    ``tracer_provider`` and ``meter_provider`` default to OpenTelemetry's
    global providers. One returned :class:`postonce.Hooks` may be shared by
    several clients and threads. Pass it as ``hooks=otel_hooks()``, or in a
    list with hooks of your own.
    """
    recorder = _Recorder(tracer_provider, meter_provider)
    return Hooks(
        on_attempt=recorder.on_attempt,
        on_retry_scheduled=recorder.on_retry_scheduled,
        on_replayed=recorder.on_replayed,
        on_expired=recorder.on_expired,
        on_give_up=recorder.on_give_up,
        on_start=recorder.on_start,
        on_end=recorder.on_end,
        around_send=recorder.around_send,
    )
