"""The benchmark scripts' own bookkeeping: what they print when a run goes wrong.

Benchmarks are never timed in tests; these check only that a script reports
what happened, without any server or timing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_async as at
import bench_drain as bd
import bench_scale as bs
from _harness import Candidate, Spread, latency_report, target_line
from floor import AsyncFloor, Floor, drain_floor


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
    assert "postonce/raw nan/nan/nan (not measured: no repeat finished both arms)" in out
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


def test_the_async_report_gives_the_clients_cpu_per_request_of_each_arm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The client runs on one CPU, so its CPU per request explains each arm's rate: the
    median over the repeats that finished (a failed run's left out)."""
    cpu = {"raw": [500e-6, 520e-6], "floor": [550e-6, 540e-6], "postonce": [800e-6, 820e-6]}
    results = at.Results()
    for transport in at.TRANSPORTS:
        for kind in at.KINDS:
            candidate = at.Candidate(kind, transport)
            for seconds in cpu[kind]:
                results.add(64, candidate, at.RunResult(100.0, 1, 1, seconds))
            results.fail(64, candidate, 3, OSError())  # a third repeat failed everywhere
    at.report(results, [64])
    out = capsys.readouterr().out
    assert "raw 510 us, floor 545 us, postonce 810 us" in out


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


@pytest.mark.parametrize(
    ("parse", "option"),
    [
        (at.parse_args, ["--latency-ms", "-1"]),
        (at.parse_args, ["--latency-ms", "nan"]),
        (at.parse_args, ["--warmup", "-1"]),
        (at.parse_args, ["--repeats", "0"]),
        (at.parse_args, ["--concurrency", "4,x"]),
        (at.parse_args, ["--concurrency", "4,0"]),
        (bd.parse_args, ["--concurrency", "two"]),
        (bd.parse_args, ["--processes", "1,0"]),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else value.__module__,
)
def test_a_scripts_bad_option_is_an_argparse_error_not_a_traceback(
    parse: Any, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(option)
    assert exited.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_the_scripts_read_their_lists_of_levels_and_a_latency() -> None:
    args = at.parse_args(["--concurrency", "16,64", "--latency-ms", "100"])
    assert (args.concurrency, args.latency_ms) == ([16, 64], 100.0)
    assert bd.parse_args(["--processes", "1,2,4"]).processes == [1, 2, 4]


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


def _arm(name: str, *p50_us: float) -> Candidate:
    """An arm whose every call of repeat i took ``p50_us[i]`` microseconds."""
    return Candidate(name, lambda: None, repeats=[[int(us * 1000)] * 10 for us in p50_us])


def test_the_latency_report_sets_each_arm_against_raw_and_its_floor_within_each_repeat(
    capsys: pytest.CaptureFixture[str],
) -> None:
    arms = [
        _arm("raw httpx", 100, 100, 100),
        _arm("floor NORMAL", 120, 120, 120),
        _arm("postonce NORMAL", 150, 156, 162),
        _arm("stamina", 100, 100, 200),  # one repeat twice the others: UNSTABLE
    ]
    summary = latency_report(arms, {"postonce NORMAL": "floor NORMAL"})
    out = capsys.readouterr().out
    assert summary == [
        "raw p50 100us",
        "floor NORMAL x1.20",
        "postonce NORMAL x1.56",
        "stamina x1.00",
        "unstable: stamina",
    ]
    ratios = out.split("ratios within each repeat")[1]
    ours = next(line for line in ratios.splitlines() if line.startswith("postonce NORMAL "))
    # p50/raw, p99/raw and p50/floor, each as min/median/max over the repeats.
    spreads = ["1.50/1.56/1.62", "1.50/1.56/1.62", "1.25/1.30/1.35"]
    assert ours.split() == ["postonce", "NORMAL", *spreads, "floor", "NORMAL"]
    assert "UNSTABLE (repeats differ by > 30% in p50 or p99): stamina" in out


def test_a_spread_is_flagged_unstable_when_its_repeats_differ_by_more_than_30_percent() -> None:
    assert Spread.of([100.0, 125.0, 130.0]).text() == "100/125/130"
    assert Spread.of([100.0, 131.0]).text() == "100/116/131 UNSTABLE"
    assert not Spread.of([100.0]).unstable  # one repeat: nothing to compare
    assert Spread.of([1.0, 2.0]).text(".1f", flag=False) == "1.0/1.5/2.0"


def test_a_target_is_printed_met_missed_or_not_measured_never_asserted() -> None:
    assert target_line("claim", 1.2, 1.5) == "target claim <= 1.50x: x1.20 met"
    assert target_line("claim", 1.6, 1.5) == "target claim <= 1.50x: x1.60 MISSED"
    shaky = Spread.of([1.0, 2.0])
    assert target_line("claim", 1.2, 1.5, shaky).endswith(
        "met, but UNSTABLE: re-run before quoting it"
    )
    assert target_line("claim", math.nan, 1.5).endswith("not measured")


def test_the_scale_outbox_holds_its_due_intents_spread_through_the_table() -> None:
    assert bs.parse_sizes("10k, 1m,500") == [10_000, 1_000_000, 500]
    kinds = bs.plan_kinds(10_000, 100, random.Random(1))
    due = [i for i, kind in enumerate(kinds) if kind.startswith("due-")]
    assert len(due) == 100
    assert (due[0], due[-1]) == (0, 9_900)
    assert kinds.count("due-sending") == 10
    assert kinds.count("tombstone") + kinds.count("succeeded") > 9_000


def _created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(201, json={"id": "ch_1"})


def test_the_floors_write_ahead_send_and_record_on_their_own_outbox(tmp_path: Path) -> None:
    """The sync and async floors: one row per call, its answer recorded (no timing)."""
    url = "http://127.0.0.1:9/v1/charges"
    with httpx.Client(transport=httpx.MockTransport(_created)) as http:
        floor = Floor(tmp_path / "f.sqlite3", "FULL", http)
        try:
            for n in range(3):
                assert floor.post_once(url, {"amount": n}).status_code == 201
        finally:
            floor.close()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_created)) as http:
            afloor = AsyncFloor(tmp_path / "a.sqlite3", "FULL", http)
            try:
                await asyncio.gather(*(afloor.post_once(url, {"amount": n}) for n in range(4)))
            finally:
                afloor.close()
        assert (afloor.writes, min(afloor.batches, 8)) == (8, afloor.batches)

    asyncio.run(run())
    for name, calls in (("f.sqlite3", 3), ("a.sqlite3", 4)):
        conn = sqlite3.connect(tmp_path / name)
        try:
            rows = conn.execute("SELECT status FROM intents").fetchall()
        finally:
            conn.close()
        assert rows == [(201,)] * calls


def test_the_drain_floor_drains_what_the_drain_benchmark_fills(tmp_path: Path) -> None:
    """``drain_floor`` runs its SQL on postonce's own outbox: it must still fit the schema."""
    outbox = tmp_path / "o.sqlite3"
    bd.fill(outbox, "http://127.0.0.1:9/v1/charges", 5)
    with httpx.Client(transport=httpx.MockTransport(_created)) as http:
        assert drain_floor(str(outbox), http, 2) == 5
    conn = sqlite3.connect(outbox)
    try:
        states = conn.execute("SELECT state, count(*) FROM intents GROUP BY state").fetchall()
    finally:
        conn.close()
    assert states == [("succeeded", 5)]


# -- every script runs, in a tiny quick mode, so none can rot -----------------------------

ROOT = Path(__file__).resolve().parent.parent
PG = "postgresql://postgres@127.0.0.1:5432/test"

#: Each script with counts small enough for the suite: it must run to its SUMMARY line.
SMOKE = {
    "latency": ["bench_latency.py", "--rounds", "3", "--warmup", "2", "--repeats", "1",
                "--no-peers"],
    "async": ["bench_async.py", "--requests", "64", "--warmup", "8", "--repeats", "1",
              "--concurrency", "8", "--latency-ms", "1"],
    "drain-sqlite": ["bench_drain.py", "--intents", "60", "--repeats", "1", "--concurrency", "2"],
    "drain-postgres": ["bench_drain.py", "--intents", "60", "--repeats", "1", "--concurrency",
                       "2", "--backend", "postgres", "--pg", PG],
    "drain-async": ["bench_drain.py", "--intents", "60", "--repeats", "1", "--concurrency", "2",
                    "--shell", "async"],
    "catch-up-sqlite": ["bench_drain.py", "--catch-up", "200", "--concurrency", "4",
                        "--latency-ms", "2"],
    "catch-up-postgres": ["bench_drain.py", "--catch-up", "200", "--concurrency", "4",
                          "--transport", "loopback", "--shapes", "crash", "--processes", "2",
                          "--backend", "postgres", "--pg", PG],
    "enqueue": ["bench_enqueue.py", "--transactions", "10", "--warmup", "2", "--repeats", "1",
                "--wakes", "3", "--pg", PG],
    "scale": ["bench_scale.py", "--sizes", "2k,4k", "--due", "100", "--backlogs", "100,400",
              "--backlog-rows", "2k", "--samples", "20", "--claim-samples", "5"],
    "wal": ["bench_wal.py", "--intents", "40", "--warmup", "10", "--repeats", "1"],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_every_benchmark_script_runs_in_a_quick_mode(name: str, tmp_path: Path) -> None:
    """Loopback only, bounded in count and time; what it prints is not judged, only that it
    runs to its SUMMARY line (a script whose API calls went stale fails here)."""
    script, *args = SMOKE[name]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SUMMARY" in done.stdout, done.stdout[-3000:]
