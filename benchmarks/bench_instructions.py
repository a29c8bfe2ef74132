"""CPU instructions per call, counted by valgrind: raw httpx, the durable floor, postonce.

Run from the repository root (valgrind must be installed; ~3 minutes)::

    .venv/bin/python benchmarks/bench_instructions.py

Wall-clock figures on a shared machine move with the neighbours. An
instruction count does not: ``valgrind --tool=callgrind`` counts the
instructions the client process executes, the same for the same code and
inputs whatever else the machine runs. It does not count time spent waiting
(the server, the disk, the kernel's side of a syscall), so it measures what
postonce adds in CPU, which is what its hot-path work costs, and is blind to
fsync and page-write waits (``bench_wal.py`` counts the pages; ``bench_sync.py``
times everything).

Each arm runs in its own process under callgrind, against the loopback server
of ``bench_sync.py`` (not instrumented): ``--warmup`` calls, then ``N`` calls.
It runs twice, with ``N = --calls`` and ``N = 3 * --calls``; the difference of
the two totals divided by ``2 * --calls`` is the per-call figure, with the
start-up (imports, schema) cancelled out. Arms:

* ``raw``: ``httpx.Client.post(url, json=body, headers={"Idempotency-Key": uuid4})``;
* ``floor``: ``benchmarks/floor.py`` with ``synchronous=NORMAL``;
* ``postonce``: ``postonce.Client(durability="normal").post_once(url, json=body,
  intent=postonce.ONE_OFF)``;
* ``schema`` (only if asked for, ``--arms raw,floor,schema,postonce``):
  ``floor.SchemaFloor`` NORMAL, the floor's Python running postonce's own
  statements on its schema; the SUMMARY then splits ``postonce - floor`` at it.

With ``--drain`` the arms are a drain's instead, per drained intent, on a
PostgreSQL outbox (``--pg``; a fresh schema per run, filled with N due intents
by the parent before the child starts, as ``bench_drain.py`` fills it):

* ``raw``: ``httpx.Client.post`` of N requests, as ``bench_drain.py``'s raw arm;
* ``floor``: ``benchmarks/drain_floor.py`` draining them;
* ``postonce``: ``postonce.Client.drain()`` draining them;

all at ``--concurrency`` (default 1). The child drains every intent it finds,
so there is no warm-up: the difference of the two runs cancels the start-up.

Python randomises string hashing per process, which moves dict and set layouts
and so the count (repeat runs of one commit were up to ~2% apart). Each child
therefore runs with a fixed ``PYTHONHASHSEED``; ``--seeds 0,1,2`` repeats every
arm under each seed and prints min/median/max over them, so one seed's luck is
not read as a change (an environment's own ``PYTHONHASHSEED`` is overridden).
Compare two commits under the same seeds. Some hashed inputs still differ from
run to run (the server's port in the URL, the outbox's temporary path, the
minted keys), so a difference within the spread over seeds is not a change.

``--measure`` picks what is counted, with the same runs and the same
difference:

* ``instructions`` (the default): callgrind's instruction count;
* ``misses``: callgrind with its cache and branch simulations
  (``--cache-sim=yes --branch-sim=yes``), which add first-level instruction
  and data misses (``I1``, ``D1``), last-level misses (``LL``) and
  mispredicted conditional and indirect branches. The simulated caches take
  this host's sizes and see this process alone, so a neighbour's evictions
  (and a shared last level) are not in them; the branch predictor is
  valgrind's simple model, not this CPU's. It shows whether an arm's extra
  instructions also miss more often, which a wall clock pays for and an
  instruction count does not;
* ``syscalls``: the child runs under ``strace -f -c`` (every thread), and the
  figure is system calls per call, by name. A syscall's kernel time is not in
  an instruction count; this says whether an arm makes more of them.

Prints thousands of instructions per call and the ratios. Asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sync import BODY, run_main, start_server

ARMS = ("raw", "floor", "postonce")
#: Arms counted only when ``--arms`` names them (never with ``--drain``).
EXTRA_ARMS = ("schema",)
MEASURES = ("instructions", "misses", "syscalls")
#: The simulated misses the SUMMARY sets postonce against the floor in: callgrind's events.
MISS_GROUPS = {"I1": ("I1mr",), "D1": ("D1mr", "D1mw"), "mispredicted": ("Bcm", "Bim")}


def _arm_call(arm: str, url: str, workdir: Path) -> Callable[[], object]:
    """The call one arm makes (in the instrumented child process)."""
    if arm == "raw":
        http = httpx.Client()
        return lambda: http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())})
    if arm == "floor":
        from floor import Floor

        floor = Floor(workdir / "floor.sqlite3", "NORMAL", httpx.Client())
        return lambda: floor.post_once(url, BODY)
    if arm == "schema":
        from floor import SchemaFloor

        schema = SchemaFloor(workdir / "schema.sqlite3", "NORMAL", httpx.Client())
        return lambda: schema.post_once(url, BODY)
    import postonce

    client = postonce.Client(outbox=workdir / "outbox.sqlite3", durability="normal")
    return lambda: client.post_once(url, json=BODY, intent=postonce.ONE_OFF)


def drain_child(arm: str, outbox: str, url: str, concurrency: int, count: int) -> None:
    """Send ``count`` requests (raw) or drain ``outbox``'s ``count`` intents (under callgrind)."""
    import bench_drain

    if arm == "raw":
        bench_drain.time_raw(url, concurrency, count)
    elif arm == "floor":
        bench_drain.time_floor(outbox, url, concurrency, count)
    else:
        bench_drain.time_drain(outbox, url, concurrency, count)


def child(arm: str, url: str, warmup: int, calls: int) -> None:
    """Make ``warmup`` then ``calls`` calls of ``arm`` (run under callgrind)."""
    workdir = Path(tempfile.mkdtemp(prefix=".tmp-instr-", dir=Path(__file__).resolve().parent))
    try:
        call = _arm_call(arm, url, workdir)
        for _ in range(warmup + calls):
            call()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _collected(arm: str, url: str, warmup: int, calls: int, seed: str, measure: str) -> Counts:
    """What the child executed (with ``PYTHONHASHSEED=seed``), counted as ``measure`` says."""
    return _counted(["--child", arm, url, str(warmup), str(calls)], arm, seed, measure)


def _drained(
    arm: str, url: str, pg: str, concurrency: int, measure: str, count: int, seed: str
) -> Counts:
    """The same for a drain arm: ``count`` due intents in a fresh schema, then the child."""
    import bench_drain

    outbox = bench_drain.fresh_postgres(pg)
    try:
        if arm != "raw":
            bench_drain.fill(outbox, url, count)
            if arm == "postonce":
                bench_drain.adopt(outbox, url)  # as bench_drain.py does, before its clock
        argv = ["--drain-child", arm, outbox, url, str(concurrency), str(count)]
        return _counted(argv, arm, seed, measure)
    finally:
        if arm != "raw":
            bench_drain.drop_postgres(outbox)


Counts = dict[str, int]


def headline(measure: str) -> tuple[str, float, str]:
    """What one figure per arm is for ``measure``: its count's name, its scale, its suffix."""
    return ("total", 1.0, "") if measure == "syscalls" else ("Ir", 1000.0, "k")


def parse_callgrind(stderr: str) -> Counts:
    """Callgrind's totals from its closing lines: event name to count.

    Its ``Events : Ir Dr ...`` line names the numbers of its ``Collected``
    line, in order (with one event, ``Ir``; read as ``Ir`` if the line is
    missing).
    """
    collected = re.search(r"Collected : ([\d ]+)$", stderr, re.MULTILINE)
    if collected is None:
        raise ValueError("no 'Collected :' line in callgrind's output")
    numbers = [int(n) for n in collected.group(1).split()]
    events = re.search(r"Events    : ([\w ]+)$", stderr, re.MULTILINE)
    names = events.group(1).split() if events is not None else ["Ir"]
    if len(names) != len(numbers):
        raise ValueError(f"callgrind named {len(names)} events and counted {len(numbers)}")
    return dict(zip(names, numbers, strict=True))


def parse_strace_summary(text: str) -> Counts:
    """``strace -c``'s table: syscall name to calls, and ``total`` (their sum).

    A syscall's row is ``% time, seconds, usecs/call, calls, [errors,] name``;
    the total row is not read (older strace leaves its usecs/call empty,
    which would shift its columns), nor the dashed rules.
    """
    counts: Counts = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) not in (5, 6) or fields[-1] == "total" or set(fields[0]) == {"-"}:
            continue
        if fields[3].isdigit() and fields[-1][:1].isalpha():
            counts[fields[-1]] = int(fields[3])
    if not counts:
        raise ValueError("no syscall rows in strace's summary")
    counts["total"] = sum(counts.values())
    return counts


def _counted(argv: list[str], arm: str, seed: str, measure: str) -> Counts:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    child_argv = [sys.executable, __file__, *argv]
    if measure == "syscalls":
        strace = shutil.which("strace")
        assert strace is not None
        with tempfile.NamedTemporaryFile("r", suffix=".strace") as summary:
            done = subprocess.run(
                [strace, "-f", "-c", "-o", summary.name, *child_argv],
                capture_output=True,
                text=True,
                check=False,
                env=env,
            )
            if done.returncode != 0:
                raise RuntimeError(f"strace run of {arm} failed:\n{done.stderr[-2000:]}")
            return parse_strace_summary(summary.read())
    valgrind = shutil.which("valgrind")
    assert valgrind is not None
    sims = ["--cache-sim=yes", "--branch-sim=yes"] if measure == "misses" else []
    done = subprocess.run(
        [valgrind, "--tool=callgrind", *sims, "--callgrind-out-file=/dev/null", *child_argv],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    problem = f"exit status {done.returncode}"
    if done.returncode == 0:
        try:
            return parse_callgrind(done.stderr)
        except ValueError as exc:
            problem = str(exc)
    raise RuntimeError(f"callgrind run of {arm} failed ({problem}):\n{done.stderr[-2000:]}")


def per_call(short: Counts, long: Counts, calls: int) -> dict[str, float]:
    """Each count's growth from the ``calls`` run to the ``3 * calls`` run, per call.

    A name missing from one run (a syscall the short run never made) counts 0 there.
    """
    return {
        name: (long.get(name, 0) - short.get(name, 0)) / (2 * calls)
        for name in sorted(short.keys() | long.keys())
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="N of the shorter run (default 100)")
    parser.add_argument("--warmup", type=int, default=30, help="uncounted calls first (default 30)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of arms")
    parser.add_argument(
        "--seeds", default="0", help="comma-separated PYTHONHASHSEED values (default 0)"
    )
    parser.add_argument(
        "--drain", action="store_true", help="a drain's arms on PostgreSQL, per drained intent"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="the drain's (default 1)")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument(
        "--measure",
        choices=MEASURES,
        default="instructions",
        help="instructions (callgrind), misses (its cache and branch simulations), syscalls",
    )
    return parser.parse_args(argv)


def _median(runs: Sequence[dict[str, float]], *names: str) -> float:
    """The median over seeds of the sum of ``names`` in each run."""
    return statistics.median(sum(run.get(name, 0.0) for name in names) for run in runs)


def describe(arm: str, runs: Sequence[dict[str, float]], measure: str, unit: str) -> str:
    """An arm's lines: its headline figure per ``unit`` (with its spread over seeds), and detail."""
    key, scale, k = headline(measure)
    what = "syscalls" if key == "total" else "k instructions"
    values = [run.get(key, 0.0) for run in runs]
    middle = statistics.median(values)
    spread = (
        f"  (min/median/max over seeds: {min(values) / scale:.1f}/{middle / scale:.1f}/"
        f"{max(values) / scale:.1f}{k})"
        if len(values) > 1
        else ""
    )
    lines = [f"{arm:10s} {middle / scale:8.1f} {what} per {unit}{spread}"]
    if measure == "misses":
        lines.append(
            f"{'':10s} misses per {unit}: I1 {_median(runs, *MISS_GROUPS['I1']) / 1000:.2f}k, "
            f"D1 {_median(runs, *MISS_GROUPS['D1']) / 1000:.2f}k "
            f"(read {_median(runs, 'D1mr') / 1000:.2f}k, "
            f"write {_median(runs, 'D1mw') / 1000:.2f}k), "
            f"LL {_median(runs, 'ILmr', 'DLmr', 'DLmw') / 1000:.3f}k; "
            f"mispredicted branches {_median(runs, *MISS_GROUPS['mispredicted']) / 1000:.2f}k "
            f"(conditional {_median(runs, 'Bcm') / 1000:.2f}k, "
            f"indirect {_median(runs, 'Bim') / 1000:.2f}k)"
        )
    elif measure == "syscalls":
        names = sorted(
            {name for run in runs for name in run} - {"total"},
            key=lambda name: (-_median(runs, name), name),
        )
        shown = [
            f"{name} {_median(runs, name):.1f}" for name in names if _median(runs, name) >= 0.05
        ]
        lines.append(f"{'':10s} by name: {', '.join(shown) or 'none'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--child":
        arm, url, warmup, calls = sys.argv[2:6]
        child(arm, url, int(warmup), int(calls))
        return 0
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--drain-child":
        arm, outbox, url, concurrency, count = sys.argv[2:7]
        drain_child(arm, outbox, url, int(concurrency), int(count))
        return 0
    args = parse_args(argv)
    arms = [arm for arm in args.arms.split(",") if arm]
    known = ARMS if args.drain else (*ARMS, *EXTRA_ARMS)
    if not arms or not set(arms) <= set(known) or len(set(arms)) < len(arms):
        print(f"--arms takes a comma-separated subset of {', '.join(known)}: {args.arms!r}")
        return 2
    tool = "strace" if args.measure == "syscalls" else "valgrind"
    if shutil.which(tool) is None:
        print(f"{tool} is not installed: nothing to count")
        return 1
    server = start_server(None)
    try:
        print(f"python: {sys.version.split()[0]}  httpx: {httpx.__version__}  server: {server.url}")
        seeds = [seed.strip() for seed in args.seeds.split(",") if seed.strip()]
        if not seeds or not all(seed.isdigit() for seed in seeds):
            print(f"--seeds takes PYTHONHASHSEED values, integers: {args.seeds!r}")
            return 2
        what = (
            f"a drain on PostgreSQL at concurrency {args.concurrency}: {args.calls} and "
            f"{3 * args.calls} intents"
            if args.drain
            else f"calls: {args.calls} and {3 * args.calls} after {args.warmup} warm-up"
        )
        print(f"{what}, per arm; PYTHONHASHSEED: {', '.join(seeds)}; measure: {args.measure}")
        unit = "intent" if args.drain else "call"
        per_arm: dict[str, float] = {}
        missed: dict[str, dict[str, float]] = {}
        for arm in arms:
            runs = []
            for seed in seeds:
                if args.drain:
                    run = functools.partial(
                        _drained, arm, server.url, args.pg, args.concurrency, args.measure
                    )
                    short, long = run(args.calls, seed), run(3 * args.calls, seed)
                else:
                    short, long = (
                        _collected(arm, server.url, args.warmup, n, seed, args.measure)
                        for n in (args.calls, 3 * args.calls)
                    )
                runs.append(per_call(short, long, args.calls))
            per_arm[arm] = _median(runs, headline(args.measure)[0])
            if args.measure == "misses":
                missed[arm] = {group: _median(runs, *ev) for group, ev in MISS_GROUPS.items()}
            print(describe(arm, runs, args.measure, unit), flush=True)
    finally:
        server.stop()
    print(summary(per_arm, args.measure, unit, args.drain, missed))
    return 0


def summary(
    per_arm: dict[str, float],
    measure: str,
    unit: str,
    drain: bool,
    missed: dict[str, dict[str, float]] | None = None,
) -> str:
    """The ``SUMMARY`` line: each arm's headline figure, and postonce's against raw and floor.

    ``missed`` (``--measure misses``): each arm's simulated misses by
    :data:`MISS_GROUPS`, of which postonce's are set against the floor's.
    """
    raw, floor, ours = (per_arm.get(arm) for arm in ARMS)
    key, scale, suffix = headline(measure)
    syscalls = key == "total"
    parts = [f"{arm} {count / scale:.1f}{suffix}" for arm, count in per_arm.items()]
    if ours is not None and raw:
        parts.append(f"postonce/raw x{ours / raw:.2f}")
    if ours is not None and floor:
        parts.append(f"postonce/floor x{ours / floor:.2f}")
    if ours is not None and raw and floor:
        parts.append(f"postonce - floor {(ours - floor) / scale:.{1 if syscalls else 0}f}{suffix}")
    schema = per_arm.get("schema")
    if ours is not None and floor and schema:
        parts.append(f"schema/floor x{schema / floor:.2f}, postonce/schema x{ours / schema:.2f}")
    what = "syscalls" if syscalls else "instructions"
    line = f"SUMMARY {what} per {unit}{' (drain)' if drain else ''}: " + ", ".join(parts)
    floor_missed, ours_missed = ((missed or {}).get(arm) for arm in ARMS[1:])
    if ours_missed and floor_missed:
        ratios = [
            f"{group} x{ours_missed[group] / floor_missed[group]:.2f}"
            for group in MISS_GROUPS
            if floor_missed.get(group)
        ]
        line += "; misses, postonce/floor: " + ", ".join(ratios)
    return line


if __name__ == "__main__":
    run_main(main)
