"""postonce.otel: a span per intent per call, its events, its status, and the metrics."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import postonce
from postonce import EndDetail, Hooks, State
from postonce.otel import SPAN_NAME, otel_hooks
from tests.conftest import FAST, LoopbackServer

ONE_TRY = FAST.model_copy(update={"attempts": 1})


class Script:
    """A transport answering from a list of statuses in turn, then the last forever."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.sent = 0
        self.current_spans: list[trace.Span] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        self.current_spans.append(trace.get_current_span())
        status = self.statuses[min(self.sent, len(self.statuses)) - 1]
        return httpx.Response(status, json={"n": self.sent})


@dataclass
class Telemetry:
    """Explicit providers (the global ones are never set) and what they recorded."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    hooks: Hooks

    def finished(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == SPAN_NAME]

    def only_span(self) -> ReadableSpan:
        (span,) = self.finished()
        return span

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """A metric's data points by their attributes: a sum's value, a histogram's point."""
        found: dict[frozenset[tuple[str, Any]], Any] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        attributes = frozenset((point.attributes or {}).items())
                        if isinstance(point, NumberDataPoint):
                            found[attributes] = point.value
                        else:
                            found[attributes] = point
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    hooks = otel_hooks(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Telemetry(exporter, reader, tracer_provider, hooks)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def client(
    outbox_path: Path,
    script: Callable[[httpx.Request], httpx.Response],
    hooks: Hooks,
    **kw: Any,
) -> postonce.Client:
    # origins=: the tests drain what they sent, and a drain needs the client's origins.
    options: dict[str, Any] = {"retry": FAST, "origins": ["https://api.test"], **kw}
    return postonce.Client(
        outbox=outbox_path, transport=httpx.MockTransport(script), hooks=hooks, **options
    )


def attrs(**kw: Any) -> frozenset[tuple[str, Any]]:
    return frozenset((f"postonce.{k}", v) for k, v in kw.items())


def events(span: ReadableSpan, name: str) -> list[dict[str, Any]]:
    return [dict(e.attributes or {}) for e in span.events if e.name == name]


def test_a_retried_call_is_one_span_with_its_attempts(
    outbox_path: Path, telemetry: Telemetry
) -> None:
    script = Script(503, 201)
    with client(outbox_path, script, telemetry.hooks) as c:
        response = c.post_once("https://api.test/c", json={}, intent="order-1/charge")
    assert response.status_code == 201
    key = response.extensions["postonce"].key

    span = telemetry.only_span()
    assert span.kind is SpanKind.CLIENT
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "postonce"
    assert span.instrumentation_scope.version == postonce.__version__
    assert dict(span.attributes or {}) == {
        "postonce.intent": "order-1/charge",
        "postonce.key": key,
        "postonce.provider": "ietf_draft",
        "postonce.drain": False,
        "postonce.prior_attempts": 0,
        "postonce.state": "succeeded",
        "postonce.attempts": 2,
    }
    assert span.status.status_code is StatusCode.UNSET
    assert [e.name for e in span.events] == ["write_ahead", "attempt", "retry_scheduled", "attempt"]
    first, second = events(span, "attempt")
    assert first["postonce.attempt"] == 1
    assert first["postonce.outcome"] == "retryable"
    assert first["http.response.status_code"] == 503
    assert first["postonce.state"] == "sending"
    assert first["postonce.replayed"] is False
    assert first["postonce.duration"] >= 0
    assert "error.type" not in first
    assert (second["postonce.attempt"], second["postonce.outcome"]) == (2, "final")
    assert second["http.response.status_code"] == 201
    (retry,) = events(span, "retry_scheduled")
    assert retry["postonce.in_foreground"] is True
    assert retry["postonce.attempt"] == 1

    assert telemetry.points("postonce.attempts") == {
        attrs(outcome="retryable", provider="ietf_draft"): 1,
        attrs(outcome="final", provider="ietf_draft"): 1,
    }
    assert telemetry.points("postonce.intents.ended") == {
        attrs(state="succeeded", provider="ietf_draft", drain=False): 1
    }
    assert telemetry.points("postonce.retries.scheduled") == {attrs(in_foreground=True): 1}
    durations = telemetry.points("postonce.attempt.duration")
    assert sum(p.count for p in durations.values()) == 2


def test_a_replay_is_an_event(outbox_path: Path, telemetry: Telemetry) -> None:
    def replaying(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, headers={"Idempotent-Replayed": "true"}, json={})

    with client(outbox_path, replaying, telemetry.hooks) as c:
        c.post_once("https://api.test/c", json={}, intent="r-1")
    span = telemetry.only_span()
    assert [e.name for e in span.events] == ["write_ahead", "attempt", "replayed"]
    assert events(span, "attempt")[0]["postonce.replayed"] is True
    assert events(span, "replayed") == [{"postonce.attempt": 1, "http.response.status_code": 201}]


def test_give_up_is_pending_not_an_error_and_the_drain_is_a_span_of_its_own(
    outbox_path: Path, telemetry: Telemetry
) -> None:
    script = Script(503)
    now = [1_000_000.0]
    with client(outbox_path, script, telemetry.hooks, retry=ONE_TRY, clock=lambda: now[0]) as c:
        with pytest.raises(postonce.IntentPending):
            c.post_once("https://api.test/c", json={}, intent="g-1")
        gave_up = telemetry.only_span()
        assert gave_up.status.status_code is not StatusCode.ERROR
        assert gave_up.attributes is not None
        assert gave_up.attributes["postonce.state"] == "pending"
        assert gave_up.attributes["postonce.error"] == "IntentPending"
        assert "error.type" not in gave_up.attributes
        assert [e.name for e in gave_up.events] == [
            "write_ahead",
            "attempt",
            "retry_scheduled",
            "give_up",
        ]
        (retry,) = events(gave_up, "retry_scheduled")
        assert retry["postonce.in_foreground"] is False
        (give_up,) = events(gave_up, "give_up")
        assert give_up["postonce.attempts"] == 1
        assert give_up["postonce.due_at"] > now[0]

        script.statuses = [201]
        now[0] += 60.0
        report = c.drain(interval=0.01)
    assert report.succeeded == 1
    first, drained = telemetry.finished()
    assert drained.attributes is not None
    assert drained.attributes["postonce.drain"] is True
    assert drained.attributes["postonce.prior_attempts"] == 1
    assert drained.attributes["postonce.state"] == "succeeded"
    assert drained.attributes["postonce.attempts"] == 2
    assert drained.attributes["postonce.key"] == first.attributes["postonce.key"]  # type: ignore[index]
    assert drained.status.status_code is StatusCode.UNSET

    assert telemetry.points("postonce.intents.ended") == {
        attrs(state="pending", provider="ietf_draft", drain=False): 1,
        attrs(state="succeeded", provider="ietf_draft", drain=True): 1,
    }
    assert telemetry.points("postonce.retries.scheduled") == {attrs(in_foreground=False): 1}
    assert telemetry.points("postonce.attempts") == {
        attrs(outcome="retryable", provider="ietf_draft"): 1,
        attrs(outcome="final", provider="ietf_draft"): 1,
    }


def test_a_spent_retry_budget_gives_up_with_its_reason(
    outbox_path: Path, telemetry: Telemetry
) -> None:
    budget = postonce.RetryBudget(5, retry_cost=5)
    with (
        client(outbox_path, Script(503), telemetry.hooks, retry_budget=budget) as c,
        pytest.raises(postonce.IntentPending, match="retry budget"),
    ):
        c.post_once("https://api.test/c", json={}, intent="b-1")
    span = telemetry.only_span()
    assert span.status.status_code is not StatusCode.ERROR
    (give_up,) = events(span, "give_up")
    assert give_up["postonce.attempts"] == 2
    assert "retry budget" in give_up["postonce.reason"]
    assert telemetry.points("postonce.retries.scheduled") == {
        attrs(in_foreground=True): 1,
        attrs(in_foreground=False): 1,
    }


#: A profile whose 422 means "key reused", whatever the body's media type.
REUSE = postonce.Provider(
    name="reuse", retention=timedelta(hours=24), mismatch=(postonce.StatusRule(status=422),)
)


def test_a_mismatch_is_an_error(outbox_path: Path, telemetry: Telemetry) -> None:
    with (
        client(outbox_path, Script(422), telemetry.hooks, provider=REUSE) as c,
        pytest.raises(postonce.IdempotencyKeyMismatch),
    ):
        # A key the caller chose may be known to the server: its reuse answer is believed.
        c.post_once("https://api.test/c", json={}, intent="m-1", key="otel-key-0001")
    span = telemetry.only_span()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "IdempotencyKeyMismatch"
    assert span.attributes is not None
    assert span.attributes["postonce.state"] == "failed"
    assert span.attributes["error.type"] == "IdempotencyKeyMismatch"
    assert events(span, "attempt")[0]["postonce.outcome"] == "mismatch"
    assert telemetry.points("postonce.intents.ended") == {
        attrs(state="failed", provider="reuse", drain=False): 1
    }


def test_a_final_refusal_is_an_error_though_the_call_returns(
    outbox_path: Path, telemetry: Telemetry
) -> None:
    with client(outbox_path, Script(400), telemetry.hooks) as c:
        response = c.post_once("https://api.test/c", json={}, intent="f-1")
    assert response.status_code == 400
    span = telemetry.only_span()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "failed: HTTP 400"
    assert span.attributes is not None
    assert span.attributes["postonce.state"] == "failed"
    assert "postonce.error" not in span.attributes


def test_expiry_is_an_error_with_an_event(outbox_path: Path, telemetry: Telemetry) -> None:
    now = [1_000_000.0]
    with client(
        outbox_path, Script(503), telemetry.hooks, retry=ONE_TRY, clock=lambda: now[0]
    ) as c:
        with pytest.raises(postonce.IntentPending):
            c.post_once("https://api.test/c", json={}, intent="e-1")
        now[0] += 30 * 24 * 3600.0  # long past any provider's retention
        with pytest.raises(postonce.IntentExpired):
            c.post_once("https://api.test/c", json={}, intent="e-1")
    _, expired = telemetry.finished()
    assert expired.status.status_code is StatusCode.ERROR
    assert expired.status.description == "IntentExpired"
    assert expired.attributes is not None
    assert expired.attributes["postonce.state"] == "expired"
    assert expired.attributes["postonce.prior_attempts"] == 1
    (event,) = events(expired, "expired")
    assert "horizon" in event["postonce.reason"]
    assert not events(expired, "attempt")  # stopped at the gate, nothing sent
    ended = telemetry.points("postonce.intents.ended")
    assert ended[attrs(state="expired", provider="ietf_draft", drain=False)] == 1


def test_the_span_is_current_only_while_it_sends(outbox_path: Path, telemetry: Telemetry) -> None:
    """Parented by the caller's span; current during each send only, never leaked to the caller."""
    script = Script(503, 201)
    tracer = telemetry.tracer_provider.get_tracer("app")
    with (
        client(outbox_path, script, telemetry.hooks) as c,
        tracer.start_as_current_span("handler") as handler,
    ):
        c.post_once("https://api.test/c", json={}, intent="p-1")
        assert trace.get_current_span() is handler  # nothing leaked into the caller
    span = telemetry.only_span()
    assert span.parent is not None
    assert span.parent.span_id == handler.get_span_context().span_id
    sent_under = [s.get_span_context().span_id for s in script.current_spans]
    assert sent_under == [span.context.span_id, span.context.span_id]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_httpx_instrumentation_spans_are_children_of_the_intent_span(
    server: LoopbackServer, outbox_path: Path, telemetry: Telemetry, kind: str
) -> None:
    """opentelemetry-instrumentation-httpx's span for each attempt is a child of the intent's."""
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    body = {"amount": 1, "_test": {"before": [{"status": 503}]}}
    provider = telemetry.tracer_provider
    if kind == "sync":
        with postonce.Client(
            server.base_url, outbox=outbox_path, retry=FAST, hooks=telemetry.hooks
        ) as c:
            HTTPXClientInstrumentor.instrument_client(c._http, tracer_provider=provider)
            c.post_once("/ietf/charges", json=body, intent="otel-http")
    else:

        async def main() -> None:
            async with postonce.AsyncClient(
                server.base_url, outbox=outbox_path, retry=FAST, hooks=telemetry.hooks
            ) as c:
                HTTPXClientInstrumentor.instrument_client(c._http, tracer_provider=provider)
                await c.post_once("/ietf/charges", json=body, intent="otel-http")

        anyio.run(main)
    intent = telemetry.only_span()
    http = [s for s in telemetry.spans.get_finished_spans() if s.name != SPAN_NAME]
    assert len(http) == 2
    for span in http:
        assert span.parent is not None
        assert span.parent.span_id == intent.context.span_id
        assert span.context.trace_id == intent.context.trace_id


def test_the_write_ahead_is_a_timed_event(outbox_path: Path, telemetry: Telemetry) -> None:
    """The outbox write-ahead before the first send is an event with its duration."""
    with client(outbox_path, Script(201), telemetry.hooks) as c:
        c.post_once("https://api.test/c", json={}, intent="wa-1")
    span = telemetry.only_span()
    (event,) = [e for e in span.events if e.name == "write_ahead"]
    assert event.attributes is not None
    duration = event.attributes["postonce.outbox.duration"]
    assert isinstance(duration, float)
    assert duration > 0


def test_async_client(outbox_path: Path, telemetry: Telemetry) -> None:
    script = Script(503, 201)

    async def main() -> httpx.Response:
        async with postonce.AsyncClient(
            outbox=outbox_path,
            retry=FAST,
            transport=httpx.MockTransport(script),
            hooks=[telemetry.hooks],
        ) as c:
            return await c.post_once("https://api.test/c", json={}, intent="a-1")

    response = anyio.run(main, backend="asyncio")
    assert response.status_code == 201
    span = telemetry.only_span()
    assert span.attributes is not None
    assert span.attributes["postonce.intent"] == "a-1"
    assert span.attributes["postonce.state"] == "succeeded"
    assert [e.name for e in span.events] == ["write_ahead", "attempt", "retry_scheduled", "attempt"]
    assert span.status.status_code is StatusCode.UNSET
    assert telemetry.points("postonce.attempts") == {
        attrs(outcome="retryable", provider="ietf_draft"): 1,
        attrs(outcome="final", provider="ietf_draft"): 1,
    }


def test_a_concurrent_async_drain_ends_every_span(outbox_path: Path, telemetry: Telemetry) -> None:
    now = [1_000_000.0]
    script = Script(503)

    async def main() -> postonce.DrainReport:
        async with postonce.AsyncClient(
            outbox=outbox_path,
            origins=["https://api.test"],
            retry=ONE_TRY,
            transport=httpx.MockTransport(script),
            hooks=telemetry.hooks,
            clock=lambda: now[0],
        ) as c:
            for i in range(8):
                with pytest.raises(postonce.IntentPending):
                    await c.post_once("https://api.test/c", json={"i": i}, intent=f"d-{i}")
            script.statuses = [201]
            now[0] += 60.0
            return await c.drain(concurrency=4, interval=0.01)

    report = anyio.run(main, backend="asyncio")
    assert report.succeeded == 8
    spans = telemetry.finished()
    assert len(spans) == 16
    drained = [s for s in spans if (s.attributes or {}).get("postonce.drain")]
    assert len(drained) == 8
    assert {(s.attributes or {}).get("postonce.state") for s in drained} == {"succeeded"}
    assert telemetry.points("postonce.intents.ended") == {
        attrs(state="pending", provider="ietf_draft", drain=False): 8,
        attrs(state="succeeded", provider="ietf_draft", drain=True): 8,
    }


def test_an_end_without_a_start_is_only_counted(telemetry: Telemetry) -> None:
    assert telemetry.hooks.on_end is not None
    telemetry.hooks.on_end(EndDetail("x", "k", State.SUCCEEDED, 1, None, "stripe", False))
    telemetry.hooks.on_end(EndDetail("y", "k", None, 0, "OutboxError", "stripe", True))
    assert telemetry.finished() == []
    assert telemetry.points("postonce.intents.ended") == {
        attrs(state="succeeded", provider="stripe", drain=False): 1,
        attrs(state="unknown", provider="stripe", drain=True): 1,
    }


def test_importing_postonce_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, postonce; "
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_the_extra_the_import_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "postonce.otel")
    with pytest.raises(ImportError, match=r"pip install 'postonce\[otel\]'"):
        importlib.import_module("postonce.otel")
