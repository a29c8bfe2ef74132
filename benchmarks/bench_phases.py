"""Where ``post_once``'s wall-clock gap over the floor lies: before, during or after the send.

Run from the repository root::

    .venv/bin/python benchmarks/bench_phases.py           # 3 repeats x 200 rounds, ~1 min

Target 1 of issue 18 is a wall-clock ratio, and it comes out wider than the
instruction count (``bench_instructions.py``) says. This script splits each
call's time in three at its transport: **before** (the call starts, up to the
transport's ``handle_request``), **wait** (inside it) and **after** (from its
return to the call's end: reading the body, recording the answer). It does so
for raw httpx, the floor NORMAL, the floor on postonce's schema NORMAL
(``schema``: ``floor.SchemaFloor``, the floor's Python running ``post_once``'s
own statements) and ``post_once`` NORMAL, each over four kinds of wait, all in
one run:

- ``server``: the loopback server of ``bench_sync.py`` on httpx's own transport;
- ``none``: a stand-in transport that answers at once (no wait at all);
- ``spin``: the stand-in busy-waits ``--wait-us`` before answering: time passes,
  the thread stays on its CPU;
- ``sleep``: the stand-in sleeps ``--wait-us``: the thread goes idle, as it does
  while a real server works.

The stand-in's answer is the server's (``201``, the same small JSON body). Every
(wait, arm) pair is a candidate with its own transport, client and outbox; each
round makes ``--block`` calls in a row of every candidate, in a seeded shuffled
order, so drift hits all alike. Each figure is the median over a repeat's calls,
shown as min/median/max over the repeats (``UNSTABLE`` when they differ by more
than 30%). ``postonce - floor`` is taken within each repeat, and so is its
split in two: ``schema - floor``, what postonce's schema and statements cost,
and ``postonce - schema``, what its Python costs on top.

What it tells: ``sleep`` minus ``spin`` is what an idle wait adds to the gap,
time passing being the same; set beside ``server`` minus ``none``, it says how
much of what the real server adds that is. It does not say why code runs
slower after an idle wait. Nothing is asserted: the script only prints.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import postonce

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sync import _RESPONSE_BODY, BODY, measure, pinned_server, print_facts, run_main
from floor import Floor, SchemaFloor
from spread import Spread

WAITS = ("none", "spin", "sleep", "server")
ARMS = ("raw", "floor", "schema", "postonce")
PHASES = ("before", "wait", "after", "total")


@dataclass
class Marks:
    """When the transport was entered and left, for the call under way."""

    entered: float = 0.0
    left: float = 0.0


def split(started: float, entered: float, left: float, ended: float) -> tuple[float, ...]:
    """(before, wait, after, total) of one call, in µs, from its four instants in seconds."""
    if not started <= entered <= left <= ended:
        raise ValueError(
            f"instants out of order: {started} {entered} {left} {ended} "
            "(did the call reach its transport?)"
        )
    return tuple(
        (b - a) * 1e6
        for a, b in ((started, entered), (entered, left), (left, ended), (started, ended))
    )


def medians(calls: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Each phase's median over a repeat's calls."""
    return tuple(statistics.median(call[i] for call in calls) for i in range(len(PHASES)))


def gap(top: Sequence[Sequence[float]], bottom: Sequence[Sequence[float]], phase: int) -> Spread:
    """``top - bottom`` in one phase, each repeat's medians against the same repeat's."""
    return Spread.of(a[phase] - b[phase] for a, b in zip(top, bottom, strict=True))


def ratio(top: Sequence[Sequence[float]], bottom: Sequence[Sequence[float]]) -> Spread:
    """``top / bottom`` of the total, within each repeat."""
    total = PHASES.index("total")
    return Spread.of(a[total] / b[total] for a, b in zip(top, bottom, strict=True))


def summary(gaps: dict[str, Spread], ratios: dict[str, Spread]) -> str:
    """One line: postonce - floor (median µs) and postonce/floor for each wait."""
    parts = [f"{w}: +{gaps[w].median:.0f}us x{ratios[w].median:.2f}" for w in WAITS]
    idle = gaps["sleep"].median - gaps["spin"].median
    return (
        "SUMMARY phases, postonce NORMAL - floor NORMAL (total), "
        + ", ".join(parts)
        + f"; idling adds {idle:+.0f}us to the gap"
    )


class _Timed(httpx.HTTPTransport):
    """httpx's own transport, marking when it is entered and left."""

    def __init__(self, marks: Marks) -> None:
        super().__init__()
        self._marks = marks

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self._marks.entered = time.perf_counter()
        response = super().handle_request(request)
        self._marks.left = time.perf_counter()
        return response


class _StandIn(httpx.BaseTransport):
    """Answers as the loopback server does, after no wait, a busy wait or a sleep."""

    def __init__(self, marks: Marks, wait: str, seconds: float) -> None:
        self._marks, self._wait, self._seconds = marks, wait, seconds

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        clock = time.perf_counter
        self._marks.entered = clock()
        request.read()  # the body is taken first, then the wait: alike for spin and sleep
        if self._wait == "spin":
            until = clock() + self._seconds
            while clock() < until:
                pass
        elif self._wait == "sleep":
            time.sleep(self._seconds)
        self._marks.left = clock()
        return httpx.Response(
            201, headers={"content-type": "application/json"}, content=_RESPONSE_BODY
        )


@dataclass
class Candidate:
    wait: str
    arm: str
    call: Callable[[], Any]
    marks: Marks
    calls: list[tuple[float, ...]] = field(default_factory=list)
    repeats: list[tuple[float, ...]] = field(default_factory=list)  # medians per repeat

    def end_repeat(self) -> None:
        self.repeats.append(medians(self.calls))
        self.calls = []


def candidates_for(
    wait: str, url: str, seconds: float, workdir: Path, closing: ExitStack
) -> list[Candidate]:
    made = []
    for arm in ARMS:
        marks = Marks()
        transport: httpx.BaseTransport = (
            _Timed(marks) if wait == "server" else _StandIn(marks, wait, seconds)
        )
        http = closing.enter_context(httpx.Client(transport=transport))
        call: Callable[[], Any]
        if arm == "raw":

            def call(http: httpx.Client = http) -> Any:
                return http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())})

        elif arm == "floor":
            floor = Floor(workdir / f"floor-{wait}.sqlite3", "NORMAL", http)
            closing.callback(floor.close)

            def call(floor: Floor = floor) -> Any:
                return floor.post_once(url, BODY)

        elif arm == "schema":
            schema = SchemaFloor(workdir / f"schema-{wait}.sqlite3", "NORMAL", http)
            closing.callback(schema.close)

            def call(schema: SchemaFloor = schema) -> Any:
                return schema.post_once(url, BODY)

        else:
            client = closing.enter_context(
                postonce.Client(
                    outbox=workdir / f"outbox-{wait}.sqlite3", durability="normal", http=http
                )
            )

            def call(client: postonce.Client = client) -> Any:
                return client.post_once(url, json=BODY, intent=postonce.ONE_OFF)

        made.append(Candidate(wait, arm, call, marks))
    return made


def run_rounds(
    candidates: Sequence[Candidate], rounds: int, rng: random.Random, keep: bool, block: int
) -> None:
    order = list(candidates)
    clock = time.perf_counter
    for _ in range(rounds):
        rng.shuffle(order)
        for candidate in order:
            marks = candidate.marks
            for _ in range(block):
                started = clock()
                response = candidate.call()
                ended = clock()
                if response.status_code != 201:
                    raise RuntimeError(f"{candidate.wait}/{candidate.arm}: got {response}")
                if keep:
                    candidate.calls.append(split(started, marks.entered, marks.left, ended))


def report(candidates: Sequence[Candidate], seconds: float) -> None:
    by = {(c.wait, c.arm): c.repeats for c in candidates}
    print("\nmedian per call (us), min/median/max over repeats")
    print(f"{'wait':7} {'arm':9} " + " ".join(f"{p:>22}" for p in PHASES))
    for wait in WAITS:
        for arm in ARMS:
            repeats = by[(wait, arm)]
            cells = [Spread.of(r[i] for r in repeats).text(".1f") for i in range(len(PHASES))]
            print(f"{wait:7} {arm:9} " + " ".join(f"{c:>22}" for c in cells))
    print("\npostonce - floor (us, within each repeat), and postonce/floor of the total")
    gaps, ratios = {}, {}
    for wait in WAITS:
        top, bottom = by[(wait, "postonce")], by[(wait, "floor")]
        cells = [gap(top, bottom, i).text("+.1f", flag=False) for i in range(len(PHASES))]
        gaps[wait], ratios[wait] = gap(top, bottom, PHASES.index("total")), ratio(top, bottom)
        row = " ".join(f"{c:>22}" for c in cells)
        print(f"{wait:7} {row}   x{ratios[wait].text('.2f')}")
    print(f"(spin and sleep wait {seconds * 1e6:.0f} us in the stand-in transport)")
    print(summary(gaps, ratios))
    print(
        "\nthe gap in two, total per call (us, and ratios, within each repeat): schema - floor "
        "is postonce's\nstatements on its schema, postonce - schema the rest of postonce"
    )
    heads = ("schema - floor", "postonce - schema", "schema/floor", "postonce/schema")
    print(f"{'wait':7} " + " ".join(f"{h:>22}" for h in heads))
    halves: dict[str, tuple[Spread, Spread]] = {}
    total = PHASES.index("total")
    for wait in WAITS:
        floor, schema, ours = (by[(wait, arm)] for arm in ("floor", "schema", "postonce"))
        halves[wait] = (ratio(schema, floor), ratio(ours, schema))
        split_cells = (
            gap(schema, floor, total).text("+.1f", flag=False),
            gap(ours, schema, total).text("+.1f", flag=False),
            "x" + halves[wait][0].text(".2f"),
            "x" + halves[wait][1].text(".2f"),
        )
        print(f"{wait:7} " + " ".join(f"{c:>22}" for c in split_cells))
    print(halves_summary(halves))


def halves_summary(halves: dict[str, tuple[Spread, Spread]]) -> str:
    """One line: schema/floor and postonce/schema (medians) for each wait."""
    parts = [
        f"{w}: schema/floor x{halves[w][0].median:.2f}, postonce/schema x{halves[w][1].median:.2f}"
        for w in WAITS
    ]
    return "SUMMARY halves, " + "; ".join(parts)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=200, help="rounds per repeat (200)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats (3)")
    parser.add_argument("--warmup", type=int, default=30, help="uncounted rounds (30)")
    parser.add_argument("--block", type=int, default=10, help="calls in a row (10)")
    parser.add_argument("--wait-us", type=float, default=150.0, help="spin/sleep length (150)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the round order")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the outboxes' directory")
    args = parser.parse_args(argv)
    if min(args.rounds, args.repeats, args.block) < 1 or args.warmup < 0 or args.wait_us < 0:
        parser.error("--rounds, --repeats, --block must be >= 1; --warmup, --wait-us >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seconds = args.wait_us / 1e6
    with pinned_server(".tmp-bench-phases-", args.dir) as pinned, ExitStack() as closing:
        print_facts(pinned.workdir, pinned.cpus, pinned.pinning, pinned.server)
        print(
            f"rounds: {args.repeats} repeats x {args.rounds} + {args.warmup} warm-up, "
            f"{args.block} calls in a row, seed {args.seed}"
        )
        candidates = [
            c
            for wait in WAITS
            for c in candidates_for(wait, pinned.server.url, seconds, pinned.workdir, closing)
        ]
        measure(run_rounds, candidates, args)
        report(candidates, seconds)
    return 0


if __name__ == "__main__":
    run_main(main)
