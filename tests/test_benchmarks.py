"""The benchmark scripts' own bookkeeping: what they print when a run goes wrong.

Benchmarks are never timed in tests; these check only that a script reports
what happened, without any server or timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import httpx
import pytest

import postonce

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import async_throughput as at
import bench_drain as bd
import bench_instructions as bi
import bench_phases as bp
from spread import Spread


def test_a_failed_run_loses_only_itself_and_is_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """One arm raising in one repeat (the floor on httpx's transport, as seen at c=64).

    The run goes on; the failed run is printed, listed, counted in the SUMMARY
    and left out of every figure: its arm's spread and its repeat's ratios.
    """
    rates = {"raw": 100.0, "floor": 80.0, "postonce": 60.0}

    async def run_candidate(candidate: at.Candidate, *args: Any) -> at.RunResult:
        repeat = calls.count(candidate) + 1
        calls.append(candidate)
        if candidate == at.Candidate("floor", "default") and repeat == 2:
            raise OSError("connection reset by the loopback server")
        # repeat 2's other arms are slower: were the failed run's repeat kept, ratios would move
        scale = 0.5 if repeat == 2 else 1.0
        return at.RunResult(rates[candidate.kind] * scale, 1, 2)

    calls: list[at.Candidate] = []
    monkeypatch.setattr(at, "run_candidate", run_candidate)
    args = argparse.Namespace(seed=1, repeats=3, run_timeout=5.0, requests=10, warmup=0)
    results = asyncio.run(at.run_all(args, [64], "http://127.0.0.1:9/", tmp_path))

    assert len(calls) == 3 * len(at.TRANSPORTS) * len(at.KINDS)  # every run was made
    assert results.failures == ["floor/default c=64 repeat 2: OSError"]
    floor_default = results.rates[(64, at.Candidate("floor", "default"))]
    assert math.isnan(floor_default[1])
    assert at.rates(results, 64, "floor", "default").values == (80.0, 80.0)
    assert at.ratio_spread(results, 64, "default", "floor").values == (0.8, 0.8)
    assert at.ratio_spread(results, 64, "default").values == (0.6, 0.6, 0.6)

    at.report(results, [64])
    out = capsys.readouterr().out
    assert "floor/default FAILED (OSError)" in out
    assert "FAILED runs, left out of every figure: floor/default c=64 repeat 2: OSError" in out
    assert out.rstrip().endswith("failed runs: 1")


def test_an_arm_whose_every_run_failed_shows_nan_not_a_crash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = at.Results()
    for transport in at.TRANSPORTS:
        for kind in at.KINDS:
            candidate = at.Candidate(kind, transport)
            if candidate == at.Candidate("postonce", "aiohttp"):
                results.fail(64, candidate, 1, TimeoutError())
            else:
                results.add(64, candidate, at.RunResult(100.0, 1, 1))
    at.report(results, [64])
    out = capsys.readouterr().out
    assert math.isnan(at.rates(results, 64, "postonce", "aiohttp").median)
    assert "target >= 0.75: not measured: no repeat finished both arms" in out
    assert "missed" not in out
    assert "NO FINISHED RUN (figures are nan): postonce/aiohttp c=64" in out
    assert "postonce/raw xnan" in out
    assert "failed runs: 1" in out
    assert results.empty() == ["postonce/aiohttp c=64"]


def test_raw_failing_at_the_top_level_is_flagged_and_left_out_of_the_best_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Raw's runs failing where its pool collapses: flagged, even with a good median left;
    a level where raw finished nothing is left out of "best level", not compared as NaN."""
    results = at.Results()
    for concurrency in (16, 64):
        for transport in at.TRANSPORTS:
            for kind in at.KINDS:
                candidate = at.Candidate(kind, transport)
                for repeat in (1, 2):
                    # raw/default: every run at c=16 fails, one of two at c=64
                    if (
                        kind == "raw"
                        and transport == "default"
                        and (repeat == 2 or concurrency == 16)
                    ):
                        results.fail(concurrency, candidate, repeat, OSError())
                    else:
                        results.add(concurrency, candidate, at.RunResult(100.0, 1, 1))
    at.report(results, [16, 64])
    out = capsys.readouterr().out
    assert "raw default: c=16 nan req/s, c=64 100 req/s  FLAG: raw collapses at c=64" in out
    assert "no finished run; 1 of its runs failed" in out
    assert "postonce 100 req/s / raw 100 req/s = x1.00" in out  # c=16's NaN left out


class Group(Exception):
    """What an anyio task group raises: its tasks' errors in ``exceptions`` (3.10 has no
    builtin ExceptionGroup)."""

    def __init__(self, *errors: BaseException) -> None:
        super().__init__("tasks")
        self.exceptions = errors


@pytest.mark.parametrize(
    ("error", "is_run_failure"),
    [
        pytest.param(OSError("reset"), True, id="transport"),
        pytest.param(TimeoutError(), True, id="timeout"),
        pytest.param(RuntimeError("expected 201"), True, id="bad-answer"),
        pytest.param(TypeError("a bug"), False, id="bug"),
        pytest.param(Group(OSError(), TimeoutError()), True, id="group"),
        pytest.param(Group(OSError(), KeyError()), False, id="group-bug"),
    ],
)
def test_only_a_failed_run_is_recorded_a_bug_of_the_script_is_raised(
    error: Exception, is_run_failure: bool
) -> None:
    assert at.run_failure(error) is is_run_failure


# bench_instructions.py: what its counters' outputs are read as.

CALLGRIND_ONE_EVENT = """\
==6764== Callgrind, a call-graph generating cache profiler
==6764== Events    : Ir
==6764== Collected : 39243263
==6764==
==6764== I   refs:      39,243,263
"""

CALLGRIND_MISSES = """\
--8432-- warning: L3 cache found, using its data for the LL simulation.
==8432== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw Bc Bcm Bi Bim
==8432== Collected : 39365326 10596190 5816231 309752 456516 87299 11439 21615 37038 \
6309112 409017 891463 210939
==8432==
==8432== I1  misses:       309,752
==8432== Mispredicts:      619,956  (   409,017 cond +   210,939 ind)
"""

STRACE_SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 83.13    0.470706        5883        80        40 wait4
  2.91    0.016490          11      1380       597 openat
  0.00    0.000000           0         6           chdir
------ ----------- ----------- --------- --------- ----------------
100.00    0.566239          62      1466       637 total
"""

# strace 4.x: no usecs/call on the total row, and -nan where no time was recorded.
STRACE_4_SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
100.00    0.071042          30      2305           read
  -nan    0.000000           0        16        16 open
------ ----------- ----------- --------- --------- ----------------
100.00    0.071042                  2321        16 total
"""


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        (CALLGRIND_ONE_EVENT, {"Ir": 39243263}),
        ("==1== Collected : 12\n", {"Ir": 12}),  # no Events line: the one default event
        (
            CALLGRIND_MISSES,
            {
                "Ir": 39365326,
                "Dr": 10596190,
                "Dw": 5816231,
                "I1mr": 309752,
                "D1mr": 456516,
                "D1mw": 87299,
                "ILmr": 11439,
                "DLmr": 21615,
                "DLmw": 37038,
                "Bc": 6309112,
                "Bcm": 409017,
                "Bi": 891463,
                "Bim": 210939,
            },
        ),
    ],
)
def test_callgrind_totals_are_read_by_event_name(stderr: str, expected: dict[str, int]) -> None:
    """The ``Collected`` numbers are named by the ``Events`` line, in its order."""
    assert bi.parse_callgrind(stderr) == expected


@pytest.mark.parametrize(
    ("stderr", "says"),
    [
        ("==1== valgrind: failed to start tool\n", "no 'Collected :' line"),  # no totals
        ("==1== Events    : Ir I1mr\n==1== Collected : 5\n", "named 2 events and counted 1"),
    ],
)
def test_callgrind_output_without_matching_totals_is_refused(stderr: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        bi.parse_callgrind(stderr)


def test_strace_summary_is_read_as_calls_by_name() -> None:
    """The calls column, with or without an errors column; the total is their sum."""
    assert bi.parse_strace_summary(STRACE_SUMMARY) == {
        "wait4": 80,
        "openat": 1380,
        "chdir": 6,
        "total": 1466,
    }
    assert bi.parse_strace_summary(STRACE_4_SUMMARY) == {"read": 2305, "open": 16, "total": 2321}
    with pytest.raises(ValueError, match="no syscall rows"):
        bi.parse_strace_summary("\n".join(STRACE_SUMMARY.splitlines()[:2]))  # header only


def test_per_call_figures_are_the_growth_between_the_two_runs() -> None:
    """(long - short) / (2 * calls); a name only one run has counts 0 in the other."""
    short = {"Ir": 1_000, "poll": 10, "brk": 3}
    long = {"Ir": 5_000, "poll": 50, "mmap": 8}
    assert bi.per_call(short, long, 100) == {"Ir": 20.0, "brk": -0.015, "mmap": 0.04, "poll": 0.2}


def test_an_arm_is_described_by_its_median_over_seeds_with_its_spread() -> None:
    miss_runs = [
        {"Ir": 2_000_000.0, "I1mr": 40_000.0, "D1mr": 20_000.0, "D1mw": 2_000.0, "DLmr": 10.0},
        {"Ir": 2_100_000.0, "I1mr": 44_000.0, "D1mr": 21_000.0, "D1mw": 2_000.0, "DLmr": 30.0},
        {"Ir": 2_050_000.0, "I1mr": 42_000.0, "D1mr": 22_000.0, "D1mw": 4_000.0, "DLmr": 20.0},
    ]
    for run, bcm in zip(miss_runs, (9_000.0, 11_000.0, 10_000.0), strict=True):
        run.update(Bcm=bcm, Bim=bcm / 2)
    assert bi.describe("postonce", miss_runs, "misses", "call").splitlines() == [
        "postonce     2050.0 k instructions per call  (min/median/max over seeds: "
        "2000.0/2050.0/2100.0k)",
        "           misses per call: I1 42.00k, D1 23.00k (read 21.00k, write 2.00k), LL 0.020k; "
        "mispredicted branches 15.00k (conditional 10.00k, indirect 5.00k)",
    ]
    syscall_runs = [{"total": 33.0, "poll": 5.0, "fcntl": 12.0, "mmap": 0.01}]
    assert bi.describe("floor", syscall_runs, "syscalls", "intent").splitlines() == [
        "floor          33.0 syscalls per intent",
        "           by name: fcntl 12.0, poll 5.0",  # most first; under 0.05 a call left out
    ]


def test_a_drain_arm_is_charged_what_its_timed_span_used_per_intent() -> None:
    """Usage read around the clock's own span, over the intents; the rate from that span."""
    marks: list[str] = []
    clock = iter([100.0, 102.0])
    # User and system time both count; voluntary switches are waits, involuntary ones preemptions.
    usage = iter(
        [
            SimpleNamespace(ru_utime=8.0, ru_stime=2.0, ru_nvcsw=100, ru_nivcsw=7),
            SimpleNamespace(ru_utime=8.45, ru_stime=2.15, ru_nvcsw=4_600, ru_nivcsw=3_007),
        ]
    )

    def tick() -> float:
        marks.append("clock")
        return next(clock)

    def read() -> SimpleNamespace:
        marks.append("usage")
        return next(usage)

    with bd.Timed(3_000, clock=tick, usage=read) as timed:
        marks.append("run")
    assert marks == ["usage", "clock", "run", "clock", "usage"]
    assert timed.rate == 1_500.0  # 3,000 intents in 2 s
    assert timed.used.cpu_us == pytest.approx(200.0)  # 0.6 s over 3,000 intents
    assert (timed.used.waits, timed.used.preempted) == (1.5, 1.0)


def test_the_client_cpu_of_a_run_holds_the_cpu_of_its_other_threads() -> None:
    """A worker thread's own CPU time (its thread clock) is in what the run is charged.

    The margin only tells "counted" from "not counted" (a reading of this thread
    alone would charge next to nothing); no figure of the machine's speed is used.
    """
    own: list[float] = []

    def work() -> None:
        began = time.thread_time()
        sum(i * i for i in range(300_000))
        own.append(time.thread_time() - began)

    with bd.Timed(1) as timed:
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert timed.used.cpu_us >= own[0] * 1e6 / 2


def test_the_drain_cpu_line_sets_each_arm_s_cpu_beside_its_wall_time() -> None:
    rates = {"drain": [1_600.0, 1_650.0, 1_700.0], "raw": [2_500.0, 2_900.0, 2_800.0]}
    used = {
        "drain": [bd.Used(540.0, 4.0, 3.0), bd.Used(530.0, 5.0, 2.0), bd.Used(560.0, 12.0, 9.0)],
        "raw": [bd.Used(350.0, 1.0, 0.0), bd.Used(300.0, 0.8, 0.2), bd.Used(360.0, 0.9, 0.0)],
    }
    assert bd.cpu_line(rates, used) == (
        "client CPU per intent, us of wall: "
        "drain 540 of 606 (busy 89%, switches 5.0 waiting + 3.0 preempted)   "
        "raw 350 of 357 (busy 98%, switches 0.9 waiting + 0.0 preempted)"
    )


def test_the_summary_line_sets_postonce_against_raw_and_floor() -> None:
    figures = {"raw": 1_731_000.0, "floor": 1_793_000.0, "postonce": 2_142_000.0}
    assert bi.summary(figures, "instructions", "call", drain=False) == (
        "SUMMARY instructions per call: raw 1731.0k, floor 1793.0k, postonce 2142.0k, "
        "postonce/raw x1.24, postonce/floor x1.19, postonce - floor 349k"
    )
    syscalls = {"raw": 12.0, "floor": 30.4, "postonce": 33.0}
    assert bi.summary(syscalls, "syscalls", "intent", drain=True) == (
        "SUMMARY syscalls per intent (drain): raw 12.0, floor 30.4, postonce 33.0, "
        "postonce/raw x2.75, postonce/floor x1.09, postonce - floor 2.6"
    )


def test_the_summary_splits_the_gap_at_the_schema_floor_when_it_was_counted() -> None:
    figures = {"raw": 1_700_000.0, "floor": 1_800_000.0, "schema": 1_890_000.0}
    figures["postonce"] = 2_268_000.0
    assert bi.summary(figures, "instructions", "call", drain=False) == (
        "SUMMARY instructions per call: raw 1700.0k, floor 1800.0k, schema 1890.0k, "
        "postonce 2268.0k, postonce/raw x1.33, postonce/floor x1.26, postonce - floor 468k, "
        "schema/floor x1.05, postonce/schema x1.20"
    )


@pytest.mark.parametrize(
    ("argv", "known"),
    [
        (["--arms", "floor,fool"], "raw, floor, postonce, schema"),
        (["--arms", ","], "raw, floor, postonce, schema"),
        (["--drain", "--arms", "raw,schema"], "raw, floor, postonce:"),
        (["--arms", "floor,floor"], "raw, floor, postonce, schema"),
    ],
)
def test_an_arm_not_known_is_refused_not_counted_as_postonce(
    argv: list[str], known: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: any name but raw and floor ran postonce's arm under that name.
    monkeypatch.setattr(bi, "start_server", _no_server)
    monkeypatch.setattr("shutil.which", lambda tool: None)  # refused before valgrind is looked for
    assert bi.main(argv) == 2
    assert f"--arms takes a comma-separated subset of {known}" in capsys.readouterr().out


def _no_server(parent: object) -> None:
    raise AssertionError("an arm not known must be refused before a server starts")


def test_the_misses_summary_sets_postonce_misses_against_the_floors() -> None:
    figures = {"raw": 1_727_600.0, "floor": 1_795_500.0, "postonce": 2_127_400.0}
    # Per-call figures by callgrind's event names, as per_call gives them (one seed),
    # grouped as main() groups them: a misspelt event would count nothing.
    runs = {
        "raw": {
            "I1mr": 37_600.0,
            "D1mr": 15_000.0,
            "D1mw": 3_660.0,
            "Bcm": 22_000.0,
            "Bim": 25_250.0,
        },
        "floor": {
            "I1mr": 39_910.0,
            "D1mr": 16_000.0,
            "D1mw": 4_000.0,
            "Bcm": 24_000.0,
            "Bim": 25_740.0,
        },
        "postonce": {
            "I1mr": 46_920.0,
            "D1mr": 20_920.0,
            "D1mw": 5_000.0,
            "Bcm": 29_000.0,
            "Bim": 30_730.0,
        },
    }
    missed = {
        arm: {group: bi._median([run], *events) for group, events in bi.MISS_GROUPS.items()}
        for arm, run in runs.items()
    }
    assert bi.summary(figures, "misses", "call", drain=False, missed=missed) == (
        "SUMMARY instructions per call: raw 1727.6k, floor 1795.5k, postonce 2127.4k, "
        "postonce/raw x1.23, postonce/floor x1.18, postonce - floor 332k; "
        "misses, postonce/floor: I1 x1.18, D1 x1.30, mispredicted x1.20"
    )
    # Without the floor's misses (an arm left out) the line says nothing of them.
    del missed["floor"]
    assert "misses" not in bi.summary(figures, "misses", "call", drain=False, missed=missed)


def test_a_call_is_split_at_its_transport_into_before_wait_and_after() -> None:
    assert bp.split(10.0, 10.000050, 10.000200, 10.000300) == pytest.approx(
        (50.0, 150.0, 100.0, 300.0)
    )
    # A call that never reached its transport keeps the previous call's marks.
    with pytest.raises(ValueError, match="out of order"):
        bp.split(20.0, 10.000050, 10.000200, 20.000300)


def test_phase_gaps_and_ratios_are_taken_within_each_repeat() -> None:
    calls = [(50.0, 1.0, 40.0, 91.0), (70.0, 1.0, 60.0, 131.0), (60.0, 3.0, 50.0, 113.0)]
    assert bp.medians(calls) == (60.0, 1.0, 50.0, 113.0)
    postonce = [(96.0, 0.4, 94.0, 190.0), (100.0, 0.4, 100.0, 200.0)]
    floor = [(68.0, 0.4, 54.0, 122.0), (60.0, 0.4, 40.0, 100.0)]
    # Repeat by repeat (28, 40), not median against median of other repeats.
    assert bp.gap(postonce, floor, 0).values == (28.0, 40.0)
    assert bp.gap(postonce, floor, 3).values == (68.0, 100.0)
    assert bp.ratio(postonce, floor).values == pytest.approx((190 / 122, 2.0))
    assert bp.gap(postonce, floor, 0).text("+.1f", flag=False) == "+28.0/+34.0/+40.0"


def test_the_phases_summary_says_what_idling_adds_to_the_gap() -> None:
    # none and spin far apart: the idle figure is sleep - spin, not sleep - none.
    gaps = {w: Spread.of([g]) for w, g in zip(bp.WAITS, (60.0, 70.5, 113.6, 116.7), strict=True)}
    ratios = {w: Spread.of([r]) for w, r in zip(bp.WAITS, (1.58, 1.26, 1.29, 1.30), strict=True)}
    assert bp.summary(gaps, ratios) == (
        "SUMMARY phases, postonce NORMAL - floor NORMAL (total), none: +60us x1.58, "
        "spin: +70us x1.26, sleep: +114us x1.29, server: +117us x1.30; "
        "idling adds +43us to the gap"
    )


def test_the_halves_summary_splits_the_gap_at_the_schema_floor() -> None:
    halves = {
        w: (Spread.of([a, a + 0.02]), Spread.of([b]))
        for w, a, b in zip(
            bp.WAITS, (1.16, 1.11, 1.10, 1.08), (1.32, 1.22, 1.20, 1.16), strict=True
        )
    }
    assert bp.halves_summary(halves) == (
        "SUMMARY halves, none: schema/floor x1.17, postonce/schema x1.32; "
        "spin: schema/floor x1.12, postonce/schema x1.22; "
        "sleep: schema/floor x1.11, postonce/schema x1.20; "
        "server: schema/floor x1.09, postonce/schema x1.16"
    )


def test_each_phase_candidate_has_its_own_marks_and_waits_as_named(tmp_path: Path) -> None:
    """The measuring side of bench_phases, without a server: a round of each stand-in wait.

    A wait can only last at least as long as asked (a lower bound, not a timing
    threshold); marks shared between candidates would let one arm's transport
    stamp another's call.
    """
    seconds = 0.002
    with ExitStack() as closing:
        candidates = [
            c
            for wait in ("none", "spin", "sleep")
            for c in bp.candidates_for(
                wait, "http://127.0.0.1:9/v1/charges", seconds, tmp_path, closing
            )
        ]
        bp.run_rounds(candidates, 1, random.Random(1), keep=True, block=2)
    assert [(c.wait, c.arm) for c in candidates] == [
        (w, a) for w in ("none", "spin", "sleep") for a in bp.ARMS
    ]
    assert len({id(c.marks) for c in candidates}) == len(candidates)
    wait = bp.PHASES.index("wait")
    for c in candidates:
        assert len(c.calls) == 2
        if c.wait != "none":
            assert all(call[wait] >= seconds * 1e6 for call in c.calls), (c.wait, c.arm, c.calls)


class _Recorder:
    """A connection that notes each statement it runs: (``synchronous`` then, SQL, values)."""

    def __init__(self, conn: sqlite3.Connection, seen: list[tuple[int, str, int]]) -> None:
        self._conn, self._seen = conn, seen

    def execute(self, sql: str, values: Sequence[Any] = ()) -> sqlite3.Cursor:
        level = self._conn.execute("PRAGMA synchronous").fetchone()[0]
        self._seen.append((level, " ".join(sql.split()), len(values)))
        return self._conn.execute(sql, values)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


#: What a first-try 2xx leaves in a row, less what differs by call (key, times, token).
_ROW_STATE = (
    "SELECT state, attempts, fresh, lease_expires_at IS NULL, lease_owner IS NULL,"
    " claim_token IS NULL, due_at IS NULL, first_delivery_at IS NULL, response_status,"
    " response_headers, response_truncated, length(response_sha256), length(fingerprint),"
    " headers, sender, origin, length(lease_owner) FROM intents ORDER BY id"
)


_LAST = "SELECT max(id) FROM intents"


def _rows_left(path: Path) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(_ROW_STATE).fetchall()
        rows.append(
            conn.execute(
                "SELECT upto - (SELECT max(id) FROM intents) FROM intents_swept"
            ).fetchone()
        )
    return rows


@pytest.mark.parametrize(("durability", "synchronous"), [("normal", "NORMAL"), ("full", "FULL")])
def test_the_schema_floor_writes_what_post_once_writes(
    durability: Literal["normal", "full"], synchronous: Literal["NORMAL", "FULL"], tmp_path: Path
) -> None:
    """``SchemaFloor`` stands for ``post_once``'s SQL: the same statements, the same rows.

    After a few calls each, every statement of the next 40 (a sweep among them)
    is noted with its SQL text, its number of bound values and the
    ``synchronous`` level it ran at, and the two lists must hold the same
    statements as often; the rows they leave (and the sweep's watermark) must
    match, column by column, wherever a value does not differ by call.
    """
    from floor import SCHEMA_SWEEP, SchemaFloor

    from postonce._outbox.decide import LEASE_SWEEP

    assert SCHEMA_SWEEP == LEASE_SWEEP  # the sweep comes as often as postonce's

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json={"id": "ch_1"})

    url, calls = "http://127.0.0.1:1/v1/charges", SCHEMA_SWEEP + 8
    ours: list[tuple[int, str, int]] = []
    floors: list[tuple[int, str, int]] = []
    with httpx.Client(transport=httpx.MockTransport(answer)) as http:
        with postonce.Client(outbox=tmp_path / "o.sqlite3", durability=durability, http=http) as c:
            for n in range(3):
                c.post_once(url, json={"amount": n}, intent=postonce.ONE_OFF)
            store: Any = c.outbox
            store._conn = _Recorder(store._conn, ours)
            for n in range(calls):
                c.post_once(url, json={"amount": n}, intent=postonce.ONE_OFF)
            store._conn = store._conn._conn
            left = _rows_left(tmp_path / "o.sqlite3")  # before close() sweeps the rest
        floor = SchemaFloor(tmp_path / "f.sqlite3", synchronous, http)
        try:
            for n in range(3):
                floor.post_once(url, {"amount": n})
            floor._conn = _Recorder(floor._conn, floors)  # type: ignore[assignment]
            for n in range(calls):
                assert floor.post_once(url, {"amount": n}).status_code == 201
        finally:
            floor.close()
    assert Counter(floors) == Counter(ours)
    assert len(ours) >= 2 * calls + 5  # each call's two, the sweep's five
    assert _rows_left(tmp_path / "f.sqlite3") == left
