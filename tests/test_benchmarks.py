"""The benchmark scripts' own bookkeeping: what they print when a run goes wrong.

Benchmarks are never timed in tests; these check only that a script reports
what happened, without any server or timing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import async_throughput as at


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
