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
* ``postonce``: ``postonce.Client(durability="normal").post_once(url, json=body)``.

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


def _arm_call(arm: str, url: str, workdir: Path) -> Callable[[], object]:
    """The call one arm makes (in the instrumented child process)."""
    if arm == "raw":
        http = httpx.Client()
        return lambda: http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())})
    if arm == "floor":
        from floor import Floor

        floor = Floor(workdir / "floor.sqlite3", "NORMAL", httpx.Client())
        return lambda: floor.post_once(url, BODY)
    import postonce

    client = postonce.Client(outbox=workdir / "outbox.sqlite3", durability="normal")
    return lambda: client.post_once(url, json=BODY)


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


def _collected(arm: str, url: str, warmup: int, calls: int, seed: str) -> int:
    """Instructions the child executed (with ``PYTHONHASHSEED=seed``), as callgrind reports them."""
    return _counted(["--child", arm, url, str(warmup), str(calls)], arm, seed)


def _drained(arm: str, url: str, pg: str, concurrency: int, count: int, seed: str) -> int:
    """The same for a drain arm: ``count`` due intents in a fresh schema, then the child."""
    import bench_drain

    outbox = bench_drain.fresh_postgres(pg)
    try:
        if arm != "raw":
            bench_drain.fill(outbox, url, count)
            if arm == "postonce":
                bench_drain.adopt(outbox, url)  # as bench_drain.py does, before its clock
        argv = ["--drain-child", arm, outbox, url, str(concurrency), str(count)]
        return _counted(argv, arm, seed)
    finally:
        if arm != "raw":
            bench_drain.drop_postgres(outbox)


def _counted(argv: list[str], arm: str, seed: str) -> int:
    valgrind = shutil.which("valgrind")
    assert valgrind is not None
    done = subprocess.run(
        [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            *argv,
        ],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": seed},
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run of {arm} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


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
    return parser.parse_args(argv)


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
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing to count")
        return 1
    arms = [arm for arm in args.arms.split(",") if arm]
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
        print(f"{what}, per arm; PYTHONHASHSEED: {', '.join(seeds)}")
        unit = "intent" if args.drain else "call"
        per_call: dict[str, float] = {}
        for arm in arms:
            counts = []
            for seed in seeds:
                if args.drain:
                    run = functools.partial(_drained, arm, server.url, args.pg, args.concurrency)
                    short, long = run(args.calls, seed), run(3 * args.calls, seed)
                else:
                    short = _collected(arm, server.url, args.warmup, args.calls, seed)
                    long = _collected(arm, server.url, args.warmup, 3 * args.calls, seed)
                counts.append((long - short) / (2 * args.calls))
            per_call[arm] = statistics.median(counts)
            spread = (
                f"  (min/median/max over seeds: "
                f"{min(counts) / 1000:.1f}/{per_call[arm] / 1000:.1f}/{max(counts) / 1000:.1f}k)"
                if len(counts) > 1
                else ""
            )
            print(
                f"{arm:10s} {per_call[arm] / 1000:8.1f} k instructions per {unit}{spread}",
                flush=True,
            )
    finally:
        server.stop()
    raw, floor, ours = (per_call.get(arm) for arm in ARMS)
    parts = [f"{arm} {count / 1000:.1f}k" for arm, count in per_call.items()]
    if ours is not None and raw:
        parts.append(f"postonce/raw x{ours / raw:.2f}")
    if ours is not None and floor:
        parts.append(f"postonce/floor x{ours / floor:.2f}")
    if ours is not None and raw and floor:
        parts.append(f"postonce - floor {(ours - floor) / 1000:.0f}k")
    print(f"SUMMARY instructions per {unit}{' (drain)' if args.drain else ''}: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    run_main(main)
