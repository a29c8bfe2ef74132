"""Gentle to a recovering provider: a 429's Retry-After pauses its origin; a rate spaces sends.

The decision (``pause_asked``) and the bookkeeping (``Pace``) are tested by
table with a hand-driven clock; the drain end to end against the loopback
server's rate limiter, which answers 429 with ``Retry-After`` to every
request while its window is open (nothing executed), as a provider that has
just come back does.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

import postonce
from postonce import State
from postonce._drain import (
    ClaimStep,
    HandBack,
    Pause,
    Proceed,
    TakeTurn,
    Tally,
    claim_steps,
    run_drain,
)
from postonce._pace import Pace, pace_origin, pause_asked
from tests.conftest import FAST, ClientFactory, LoopbackServer

NOW = 1_000_000.0


@pytest.mark.parametrize(
    ("status", "headers", "until"),
    [
        pytest.param(429, {"Retry-After": "2"}, NOW + 2, id="429-seconds"),
        pytest.param(503, {"Retry-After": "5"}, NOW + 5, id="503-seconds"),
        pytest.param(429, {"retry-after-ms": "1500"}, NOW + 1.5, id="429-ms"),
        pytest.param(
            429, {"Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"}, None, id="429-date-past"
        ),
        pytest.param(429, {"Retry-After": "600"}, NOW + 60, id="capped-at-retry-after-max"),
        pytest.param(429, {}, None, id="429-without-retry-after"),
        pytest.param(429, {"Retry-After": "soon"}, None, id="garbage"),
        pytest.param(429, {"Retry-After": "0"}, None, id="zero"),
        pytest.param(500, {"Retry-After": "2"}, None, id="500-is-not-a-pause"),
        pytest.param(409, {"Retry-After": "2"}, None, id="in-flight-is-the-intents-own"),
        pytest.param(201, {"Retry-After": "2"}, None, id="success"),
    ],
)
def test_which_answers_pause_their_origin(
    status: int, headers: dict[str, str], until: float | None
) -> None:
    """Only a 429 or 503 with a readable, positive wait speaks for the whole origin."""
    got = pause_asked(status, httpx.Headers(headers), NOW, cap=60.0)
    assert got == (pytest.approx(until) if until is not None else None)


def test_a_pause_lasts_its_time_for_its_origin_only_and_the_longest_wins() -> None:
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0)
    pace.heard("https://a.test:443", 429, httpx.Headers({"Retry-After": "5"}))
    pace.heard("https://a.test:443", 429, httpx.Headers({"Retry-After": "2"}))  # shorter: kept 5
    assert pace.paused() == {"https://a.test:443"}
    assert pace.paused_until("https://a.test:443") == NOW + 5
    assert pace.paused_until("https://b.test:443") is None
    assert pace.paused_until(None) is None
    now[0] = NOW + 5
    assert pace.paused() == frozenset()
    assert pace.paused_until("https://a.test:443") is None


@pytest.mark.parametrize(
    ("rate", "waits"),
    [
        pytest.param(None, [0.0, 0.0, 0.0, 0.0], id="no-rate"),
        pytest.param(4.0, [0.0, 0.25, 0.5, 0.75], id="4-a-second"),
        pytest.param(0.5, [0.0, 2.0, 4.0, 6.0], id="one-every-2s"),
    ],
)
def test_a_rate_spaces_the_sends_to_each_origin(rate: float | None, waits: list[float]) -> None:
    """Slots taken at one instant are spaced evenly; another origin has its own."""
    pace = Pace(lambda: NOW, cap=60.0, rate=rate)
    assert [pace.slot("https://a.test:443") for _ in waits] == pytest.approx(waits)
    assert pace.slot("https://b.test:443") == 0.0


@pytest.mark.parametrize(
    ("rate", "at", "gaps"),
    [
        pytest.param(None, [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], id="no-rate"),
        pytest.param(10.0, [0.0, 0.0, 0.0], [0.0, 0.1, 0.2], id="three-at-once-are-spaced"),
        pytest.param(10.0, [0.0, 0.25, 0.3], [0.0, 0.0, 0.05], id="after-a-stall-one-spacing"),
        pytest.param(10.0, [0.0, 1.0, 2.0], [0.0, 0.0, 0.0], id="spaced-already"),
    ],
)
def test_a_send_keeps_its_distance_from_the_send_before_it(
    rate: float | None, at: list[float], gaps: list[float]
) -> None:
    """``gap`` at the send turn: flows that reach their turns together (a stall held the
    turns past their slots) are spaced again, one ``1 / rate`` apart; an origin of its own
    and a send of no origin are not held."""
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=rate)
    got = []
    for i, offset in enumerate(at):
        now[0] = NOW + offset
        got.append(pace.gap("https://a.test:443"))
        assert pace.gap(f"https://b{i}.test:443") == 0.0  # a's sends do not hold b's
    assert got == pytest.approx(gaps)
    assert pace.gap(None) == 0.0


def test_a_paused_origin_takes_no_slot_and_no_send_time() -> None:
    """While ``a`` is paused its claims go back at once: no wait, and nothing taken that
    would hold back its sends after the pause (its first one then waits for nothing)."""
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=1.0)
    pace.heard("https://a.test:443", 429, httpx.Headers({"Retry-After": "5"}))
    assert [pace.slot("https://a.test:443") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert [pace.gap("https://a.test:443") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert pace.slot("https://b.test:443") == 0.0
    assert pace.slot("https://b.test:443") == 1.0  # b is not paused: spaced
    now[0] = NOW + 5
    assert pace.slot("https://a.test:443") == 0.0
    assert pace.gap("https://a.test:443") == 0.0
    assert pace.slot("https://a.test:443") == 1.0


@pytest.mark.parametrize(
    ("origin", "url", "paced_by"),
    [
        pytest.param("https://a.test:443", "https://a.test/v1", "https://a.test:443", id="stored"),
        pytest.param(None, "https://B.test/v1/x", "https://b.test:443", id="none-its-url"),
        pytest.param(None, "http://b.test:8080/x", "http://b.test:8080", id="none-port"),
        pytest.param(None, "/relative", None, id="none-and-no-absolute-url"),
    ],
)
def test_an_intent_is_paced_by_its_origin_or_else_its_urls(
    origin: str | None, url: str, paced_by: str | None
) -> None:
    record = SimpleNamespace(origin=origin, url=url)
    assert pace_origin(record) == paced_by  # type: ignore[arg-type]


@pytest.mark.parametrize("rate", [0, -1, float("inf"), float("nan")])
def test_a_rate_that_is_not_a_positive_number_is_refused(
    rate: float, make_client: ClientFactory
) -> None:
    client = make_client("http://api.test", name="gentle")
    with pytest.raises(postonce.ConfigurationError, match="rate must be a positive number"):
        client.drain(rate=rate)


# -- end to end: a provider that rate-limits after an outage ------------------------------

N = 12
ONE_TRY = FAST.model_copy(update={"attempts": 1})


def backlog(
    make_client: ClientFactory, server: LoopbackServer, body: dict[str, Any], slow: int = 0
) -> Any:
    """N due intents left pending by an outage (a 503 from the same origin), and the drain's
    client: same outbox, name and origin, now talking to the recovered server. The first
    ``slow`` intents' answers take 0.4 s."""
    down = make_client(
        server.base_url,
        name="gentle",
        transport=httpx.MockTransport(lambda request: httpx.Response(503)),
    )
    path = f"/ietf/charges/{uuid.uuid4().hex}"  # the server is shared: this test's own path
    for i in range(N):
        with pytest.raises(postonce.IntentPending):
            down.post_once(
                path,
                json={**body, "_test": {"delay": 0.4}} if i < slow else body,
                intent=f"catch-up-{i}",
                retry=FAST.model_copy(update={"attempts": 1}),
            )
    due = [r.due_at for r in (down.lookup(f"catch-up-{i}") for i in range(N)) if r and r.due_at]
    assert len(due) == N
    time.sleep(max(0.0, max(due) - time.time()))
    return make_client(server.base_url, name="gentle"), path


def requests_to(server: LoopbackServer, path: str) -> list[dict[str, Any]]:
    return [r for r in server.ledger()["requests"] if r["path"] == path]


def test_a_429_with_retry_after_pauses_the_whole_origin_then_the_backlog_drains_once(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """The first answer is 429 Retry-After 2: no other intent goes there within those 2 s.

    Before: the drain sent all twelve into the open window (twelve 429s).
    """
    limit = {"window": uuid.uuid4().hex, "retry_after": 2}
    drain, path = backlog(make_client, server, {"amount": 1, "_test": {"rate_limit": limit}})
    first = drain.drain()
    sent = requests_to(server, path)
    assert len(sent) == 1  # the one that heard the 429; the rest waited
    assert first.claimed >= 1
    assert first.paused == first.claimed - 1
    assert first.failed == first.expired == 0
    assert first.ok
    for i in range(N):
        record = drain.lookup(f"catch-up-{i}")
        assert record is not None
        assert record.state is State.PENDING
    time.sleep(max(0.0, sent[0]["at"] + 2.2 - time.monotonic()))
    report = drain.drain()
    assert report.succeeded == N
    keys = {str(drain.lookup(f"catch-up-{i}").key) for i in range(N)}
    assert sorted(e["key"] for e in server.ledger()["effects"] if e["key"] in keys) == sorted(keys)
    # Every send after the window opened waited for it to close.
    assert all(r["at"] >= sent[0]["at"] + 1.9 for r in requests_to(server, path)[1:])


def test_a_drain_rate_spaces_the_sends_to_an_origin(
    make_client: ClientFactory, server: LoopbackServer
) -> None:
    """rate=20: twelve intents to one origin take at least 11 slots of 50 ms, however many
    flows send them (a lower bound: a slow host only takes longer); each executed once."""
    drain, path = backlog(make_client, server, {"amount": 1})
    report = drain.drain(rate=20.0, concurrency=4)
    assert report.succeeded == N
    assert report.duration >= (N - 1) / 20.0
    assert len(requests_to(server, path)) == N


def test_an_async_drains_sends_keep_their_rate_after_a_slow_answer(
    make_async_client: ClientFactory, server: LoopbackServer
) -> None:
    """rate=10 and one send turn; half the answers take 0.4 s. The async drain takes every
    claim's slot at once, so sends whose slots passed during a slow answer wait for the turn
    together: after it they still reach the server 0.1 s apart (before: a burst)."""
    drain, path = backlog(make_async_client, server, {"amount": 1}, slow=N // 2)
    report = drain.drain(rate=10.0, concurrency=1)
    assert report.succeeded == N
    arrived = sorted(r["at"] for r in requests_to(server, path))
    assert len(arrived) == N
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrived)]
    assert min(gaps) >= 0.05, gaps  # one spacing is 0.1 s, a burst a few ms; arrival jitters


# -- the drain loop with fakes: what a pause does to the rest of a batch -------------------


def _claimed(i: int, lease_for: float = 3600.0, origin: str | None = "https://a.test:443") -> Any:
    """A claimed intent to one origin, as the drain loop sees it, leased for ``lease_for`` s
    (stored without its origin when ``origin`` is None: paced by its URL's)."""
    record = SimpleNamespace(
        origin=origin, url=f"https://a.test/v1/charges/{i}", reference=f"r{i}", due_at=None
    )
    lease = SimpleNamespace(expires_at=time.time() + lease_for)
    return SimpleNamespace(record=record, lease=lease, anchor_before=None)


def _steps(pace: Pace, now: list[float], lease_for: float = 3600.0, **when: Any) -> list[Any]:
    """Drive ``claim_steps`` for one claim at ``now``, as a drain would, and name its steps.

    ``when``: what happens during a step of that name ("TakeTurn": the wait for the
    turn), a callable given the step; "stopping" is what the drain answers when asked.
    A turn is named "turn" when its answers reach the pace, else "turn, deaf".
    """
    opened = _claimed(0, lease_for=lease_for)
    opened.lease.expires_at = now[0] + lease_for
    stopping = when.pop("stopping", False)
    got: list[Any] = []
    step: ClaimStep
    for step in claim_steps(opened, pace, lambda: now[0], lambda: stopping):
        if isinstance(step, Pause):  # to the microsecond: a clock's float sums drift below it
            step = Pause(round(step.seconds, 6))
        if isinstance(step, TakeTurn):
            got.append("turn" if step.heard is not None else "turn, deaf")
        else:
            got.append(step)
        when.get(type(step).__name__, lambda step: None)(step)
    return got


def _hear_429(pace: Pace, seconds: int) -> None:
    pace.heard("https://a.test:443", 429, httpx.Headers({"Retry-After": str(seconds)}))


def test_a_claim_on_its_own_takes_its_turn_and_proceeds() -> None:
    now = [NOW]
    assert _steps(Pace(lambda: now[0], cap=60.0), now) == ["turn", Proceed()]


def test_a_claim_waits_for_its_rate_slot_before_it_takes_a_turn() -> None:
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=2.0)
    pace.slot("https://a.test:443")  # the claim before it
    assert _steps(pace, now) == [Pause(0.5), "turn", Proceed()]


def test_a_claim_whose_slot_comes_after_its_lease_goes_back_due_at_its_slot() -> None:
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=1.0)
    pace.slot("https://a.test:443")
    assert _steps(pace, now, lease_for=1.5) == [HandBack(NOW + 1.0, "paused")]
    assert _steps(pace, now, lease_for=3.5) == [Pause(2.0), "turn", Proceed()]


def test_a_claim_to_a_paused_origin_goes_back_due_when_the_pause_ends() -> None:
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=1.0)
    _hear_429(pace, 5)
    assert _steps(pace, now) == ["turn", HandBack(NOW + 5, "paused")]


def test_a_paused_origin_wins_over_a_stopping_drain() -> None:
    """Handed back due when the pause ends, not as it was: the next drain must not send
    into the window the provider asked for."""
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0)
    _hear_429(pace, 5)
    assert _steps(pace, now, stopping=True) == ["turn", HandBack(NOW + 5, "paused")]


def test_a_429_heard_while_a_claim_waited_for_its_turn_holds_it_back_too() -> None:
    """Another flow's turn hears the 429 (through the ``heard`` its step carries)."""
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0)

    def another_flows_429(step: TakeTurn) -> None:
        assert step.heard is not None
        step.heard(429, httpx.Headers({"Retry-After": "5"}))

    steps = _steps(pace, now, TakeTurn=another_flows_429)
    assert steps == ["turn", HandBack(NOW + 5, "paused")]


def test_a_stopping_drain_hands_the_claim_back_as_it_was() -> None:
    now = [NOW]
    steps = _steps(Pace(lambda: now[0], cap=60.0), now, stopping=True)
    assert steps == ["turn", HandBack(None, "pending")]


def test_a_turn_reached_after_a_stall_keeps_its_send_one_spacing_after_the_last() -> None:
    """Rate 10/s: the claim's slot (0.1 s) passed while it waited for its turn; the claim
    that sent before it did so right then, so it waits one spacing more."""
    now = [NOW]
    pace = Pace(lambda: now[0], cap=60.0, rate=10.0)
    pace.slot("https://a.test:443")  # the claim before it: slot now

    def stalled(step: TakeTurn) -> None:
        now[0] = NOW + 0.5
        assert pace.gap("https://a.test:443") == 0.0  # the one before sends at 0.5

    assert _steps(pace, now, TakeTurn=stalled) == [Pause(0.1), "turn", Pause(0.1), Proceed()]


def test_a_stop_ends_a_drains_wait_for_a_rate_slot_and_hands_the_claim_back() -> None:
    """At 0.2 sends a second the second claim's slot is 5 s away; a stop 0.3 s in ends the
    wait, and the claim goes back due as it was, unsent."""
    stop = threading.Event()
    batches = [[_claimed(i) for i in range(2)]]
    sent: list[str] = []
    released: list[tuple[str, float | None]] = []
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    report = run_drain(
        claim=lambda due_by, limit, paused: batches.pop(0) if batches else [],
        process=lambda opened, turn: sent.append(opened.record.reference),
        release=lambda opened, due_at: released.append((opened.record.reference, due_at)),
        clock=time.time, tally=Tally(), forever=False, interval=0.05, concurrency=1, flows=1,
        stop=stop, pace=Pace(time.time, cap=60.0, rate=0.2),
    )  # fmt: skip
    assert time.monotonic() - began < 3.0
    assert sent == ["r0"]
    assert released == [("r1", None)]
    assert report.pending == 1


def _drain_with_a_429(release: Any, *, forever: bool) -> tuple[Any, list[str], list[float]]:
    """run_drain over one batch of 6 to one origin at rate 2/s; the first send hears a 429
    asking for 30 s. Returns the report, what was sent, and when each release came."""
    pace = Pace(time.time, cap=60.0, rate=2.0)
    stop = threading.Event()
    batches = [[_claimed(i) for i in range(6)]]
    sent: list[str] = []
    released: list[float] = []
    began = time.monotonic()

    def process(opened: Any, turn: Any) -> None:
        turn.sending()
        sent.append(opened.record.reference)
        turn.answered(429, httpx.Headers({"Retry-After": "30"}))

    def released_at(opened: Any, due_at: float | None) -> None:
        released.append(time.monotonic() - began)
        release(opened, due_at)

    if forever:
        threading.Timer(1.0, stop.set).start()
    report = run_drain(
        claim=lambda due_by, limit, paused: batches.pop(0) if batches else [],
        process=process,
        release=released_at,
        clock=time.time,
        tally=Tally(),
        forever=forever,
        interval=0.05,
        concurrency=1,
        flows=1,
        stop=stop,
        pace=pace,
    )
    return report, sent, released


def test_claims_of_a_paused_origin_go_back_at_once_not_after_their_rate_slots() -> None:
    """At 2 sends a second, the five claims behind the 429 are handed back at once (before:
    one every half second, 2.5 s for the batch, their slots wasted)."""
    report, sent, released = _drain_with_a_429(lambda opened, due_at: None, forever=False)
    assert sent == ["r0"]
    assert report.paused == 5
    assert len(released) == 5
    assert max(released) < 0.4


def test_a_failed_hand_back_is_counted_and_the_forever_drain_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An outbox that refuses the releases (locked): counted as errors, logged, the lease left
    to run out; a forever drain keeps running until it is stopped (before: it raised)."""

    def locked(opened: Any, due_at: float | None) -> None:
        raise postonce.OutboxError("database is locked")

    with caplog.at_level("WARNING", logger="postonce"):
        report, sent, released = _drain_with_a_429(locked, forever=True)
    assert sent == ["r0"]
    assert len(released) == 5
    assert report.errors == 5
    assert report.paused == 0
    assert "claimed again when its lease runs out" in caplog.text


def test_a_rate_slot_after_the_claims_lease_hands_the_claim_back_due_at_its_slot() -> None:
    """At 2 sends a second with leases of 2.75 s, the claims whose slot comes within a second
    of their lease's end are not waited for (their lease would run out, and another drain
    could claim them meanwhile): handed back, due at their slot."""
    pace = Pace(time.time, cap=60.0, rate=2.0)
    batches = [[_claimed(i, lease_for=2.75) for i in range(6)]]
    sent: list[str] = []
    released: list[tuple[str, float | None]] = []
    began = time.time()

    def process(opened: Any, turn: Any) -> None:
        turn.sending()
        sent.append(opened.record.reference)
        turn.answered(201, httpx.Headers())

    report = run_drain(
        claim=lambda due_by, limit, paused: batches.pop(0) if batches else [],
        process=process,
        release=lambda opened, due_at: released.append((opened.record.reference, due_at)),
        clock=time.time, tally=Tally(), forever=False, interval=0.05, concurrency=1, flows=1,
        stop=threading.Event(), pace=pace,
    )  # fmt: skip
    assert sent == ["r0", "r1", "r2", "r3"]  # slots at 0, 0.5, 1.0 and 1.5 s
    assert [reference for reference, _ in released] == ["r4", "r5"]
    assert report.paused == 2
    dues = [due_at - began for _, due_at in released if due_at is not None]
    assert dues == pytest.approx([2.0, 2.5], abs=0.3)  # their slots


@pytest.mark.parametrize("origin", ["https://a.test:443", None], ids=["stored", "from-its-url"])
def test_sends_that_waited_out_a_stall_do_not_burst_when_it_ends(origin: str | None) -> None:
    """Rate 10/s, one send turn, four flows: the first send stalls 0.5 s holding the turn
    while the next three flows' slots (0.1, 0.2, 0.3 s) pass. When it ends they still send
    0.1 s apart (before: the three within a few ms of each other). An intent stored
    without its origin is paced by its URL's (before: not paced at all)."""
    pace = Pace(time.time, cap=60.0, rate=10.0)
    batches = [[_claimed(i, origin=origin) for i in range(4)]]
    sent: list[float] = []
    began = time.monotonic()

    def process(opened: Any, turn: Any) -> None:
        turn.sending()
        sent.append(time.monotonic() - began)
        if opened.record.reference == "r0":
            time.sleep(0.5)
        turn.answered(201, httpx.Headers())

    report = run_drain(
        claim=lambda due_by, limit, paused: batches.pop(0) if batches else [],
        process=process, release=lambda opened, due_at: None, clock=time.time, tally=Tally(),
        forever=False, interval=0.05, concurrency=1, flows=4, stop=threading.Event(), pace=pace,
    )  # fmt: skip
    assert report.paused == 0
    assert len(sent) == 4
    assert sent[1] >= 0.5  # behind the stall
    gaps = [later - earlier for earlier, later in itertools.pairwise(sent)]
    assert min(gaps) >= 0.05, gaps  # one spacing is 0.1 s, a burst a few ms; arrival jitters
