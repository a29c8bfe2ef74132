"""Peak memory (RSS) of a process draining a large backlog of due intents.

Run from the repository root::

    .venv-bench/bin/python benchmarks/bench_rss.py

The outbox (a fresh SQLite file under ``benchmarks/``; ``--dir`` picks another
parent) is filled, through the store's own API in batches of one transaction
each, with ``--n`` (default 100,000) pending intents due an hour ago, each as
the foreground leaves one whose retry budget ran out after a connect error:
intent, lease, then one ``not_sent`` attempt recorded with a due time. Then a
child process drains them against the loopback server of ``bench_sync.py``
(its own process, pinned to the second CPU; the child runs on the first):

* ``--via api`` (default): ``postonce.Client(outbox=PATH).drain(concurrency=C)``;
* ``--via cli``: ``postonce drain --app postonce:Client --outbox PATH
  --concurrency C`` (run as ``python -m postonce`` runs it), the command a cron
  job or systemd unit runs;
* ``--via both``: one after the other, each on a freshly filled outbox.

The peak RSS is the child's own ``VmHWM`` (``/proc/self/status``), written
by the child at exit. ``ru_maxrss`` from ``os.wait4`` is printed beside it
but is not the measure: Linux counts in it the RSS of the spawning process
(this one) at exec time. The child's ``VmRSS`` is sampled while it runs,
with the number of intents finished so far, to show whether memory grows
with the work done or levels off. A child that drains an empty outbox gives
the baseline (interpreter, imports, client). Prints intents per second too,
and asserts nothing about either.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import postonce
from postonce._intent import Outcome, State
from postonce._outbox.base import AttemptRecord
from postonce._outbox.locate import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drain import open_call
from bench_sync import filesystem_of, pinned_server, run_main

TARGET_MB = 150.0
BATCH = 1000

# Runs in the child: one drain pass, then its own peak RSS (VmHWM, counted from its exec)
# into the file named by BENCH_RSS_PEAK. "api" calls Client.drain; "cli" runs the
# command exactly as ``python -m postonce drain ...`` does.
_CHILD = """\
import atexit, os, runpy, sys
def _peak():
    status = open("/proc/self/status").read()
    with open(os.environ["BENCH_RSS_PEAK"], "w") as out:
        out.write(status.split("VmHWM:")[1].split()[0])
atexit.register(_peak)
mode = sys.argv.pop(1)
if mode == "api":
    import postonce
    client = postonce.Client(outbox=sys.argv[1])
    report = client.drain(concurrency=int(sys.argv[2]))
    client.close()
    print(report.model_dump_json())
else:
    runpy.run_module("postonce", run_name="__main__", alter_sys=True)
"""


def fill_pending(path: Path, url: str, count: int) -> float:
    """``count`` pending intents due an hour ago, one not_sent attempt each; seconds taken."""
    started = time.perf_counter()
    store = open_store(str(path), durability="normal")
    batch = getattr(store, "run_batch")  # noqa: B009 (both stores have it, not the protocol)
    long_ago = time.time() - 3600
    try:
        for start in range(0, count, BATCH):
            opens = [
                open_call(
                    f"rss-{i:07d}/charge", url, owner="bench-rss/fill", now=long_ago, lease_for=60.0
                )
                for i in range(start, min(count, start + BATCH))
            ]
            records = []
            for ok, opened in batch(opens):
                if not ok:
                    raise opened
                attempt = AttemptRecord(
                    started_at=long_ago,
                    duration=0.001,
                    outcome=Outcome.NOT_SENT,
                    status=None,
                    error_type="ConnectError",
                    replayed=False,
                )
                records.append(
                    (
                        "record",
                        {
                            "lease": opened.lease,
                            "attempt": attempt,
                            "state": State.PENDING,
                            "anchor": None,
                            "due_at": long_ago + 1.0,
                            "lease_until": None,
                            "response": None,
                            "note": None,
                            "durable": False,
                        },
                    )
                )
            for ok, result in batch(records):
                if not ok or result is not True:
                    raise RuntimeError(f"fill: record failed: {result!r}")
        due = store.stats(now=time.time())["due_now"]
    finally:
        store.close()
    if due != count:
        raise RuntimeError(f"fill: {due} due intents, expected {count}")
    return time.perf_counter() - started


# -- the child ------------------------------------------------------------------------------


@dataclass
class Run:
    via: str
    intents: int
    seconds: float = 0.0
    peak_kb: int = 0  # VmHWM of the child, written by the child itself at exit
    maxrss_kb: int = 0  # wait4's ru_maxrss: also counts the parent's RSS at spawn
    exit_code: int | None = None
    report: dict[str, Any] = field(default_factory=dict)
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (s, done, VmRSS kB)


def _vmrss_kb(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _done(reader: sqlite3.Connection | None) -> int:
    if reader is None:
        return 0
    try:
        row = reader.execute("SELECT count(*) FROM intents WHERE state = 'succeeded'").fetchone()
    except sqlite3.Error:
        return -1
    return int(row[0])


def command_for(via: str, outbox: Path, concurrency: int) -> list[str]:
    if via == "api":
        return [sys.executable, "-c", _CHILD, "api", str(outbox), str(concurrency)]
    return [
        *(sys.executable, "-c", _CHILD, "cli", "drain", "--app", "postonce:Client"),
        *("--outbox", str(outbox), "--concurrency", str(concurrency)),
    ]


def drain_in_child(
    via: str, outbox: Path, concurrency: int, intents: int, every: float, timeout: float
) -> Run:
    """Drain ``outbox`` in a child process; sample it while it runs; reap it with wait4."""
    run = Run(via=via, intents=intents)
    out_path, err_path = outbox.with_suffix(".out"), outbox.with_suffix(".err")
    peak_path = outbox.with_suffix(".peak")
    env = {
        **os.environ,
        "POSTONCE_OUTBOX": str(outbox),  # never the user's default outbox
        "BENCH_RSS_PEAK": str(peak_path),
    }
    reader = sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=5) if intents else None
    with out_path.open("w") as out, err_path.open("w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(
            command_for(via, outbox, concurrency), stdout=out, stderr=err, env=env
        )
        try:
            next_sample = started
            while True:
                # Reap it ourselves: wait4 hands back this one child's rusage.
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                now = time.perf_counter()
                if pid == proc.pid:
                    run.seconds = now - started
                    run.maxrss_kb = int(usage.ru_maxrss)
                    run.exit_code = os.waitstatus_to_exitcode(status)
                    proc.returncode = run.exit_code  # so Popen never waits for it again
                    break
                if now - started > timeout:
                    raise RuntimeError(f"the {via} drain did not finish in {timeout:.0f} s")
                if now >= next_sample:
                    run.timeline.append((now - started, _done(reader), _vmrss_kb(proc.pid)))
                    next_sample = now + every
                time.sleep(0.05)
        finally:
            if proc.returncode is None:  # timeout, Ctrl-C, an error: end our child
                proc.kill()
                os.wait4(proc.pid, 0)
                proc.returncode = -9
            if reader is not None:
                reader.close()
    text = out_path.read_text()
    if run.exit_code != 0:
        tail = err_path.read_text()[-2000:]
        raise RuntimeError(f"the {via} drain exited {run.exit_code}: {text[-2000:]}{tail}")
    run.report = json.loads(text)
    run.peak_kb = int(peak_path.read_text())
    if run.report.get("succeeded") != intents:
        raise RuntimeError(f"the {via} drain finished {run.report} of {intents}")
    return run


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000, help="due intents (default 100000)")
    parser.add_argument("--concurrency", type=int, default=8, help="drain concurrency (8)")
    parser.add_argument("--via", choices=["api", "cli", "both"], default="api")
    parser.add_argument("--quick", action="store_true", help="--n 10000")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per drain (default 1800)")
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.every = 10_000, 1.0
    if args.n < 1 or args.concurrency < 1:
        parser.error("--n and --concurrency must be >= 1")
    return args


def show(run: Run, baseline_kb: int) -> None:
    mb = run.peak_kb / 1024
    report = run.report
    rate = run.intents / report["duration"] if report.get("duration") else 0.0
    print(
        f"  {run.via}: {report.get('succeeded')} succeeded, {report.get('claimed')} claimed, "
        f"{report.get('errors')} errors; drain {report.get('duration', 0):.1f} s "
        f"({rate:.0f} intents/s), process wall {run.seconds:.1f} s "
        f"({run.intents / run.seconds:.0f} intents/s)"
    )
    print(
        f"  {run.via}: peak RSS {mb:.1f} MB (child's VmHWM), "
        f"{mb - baseline_kb / 1024:+.1f} MB over the empty-outbox baseline; "
        f"target < {TARGET_MB:.0f} MB: {'met' if mb < TARGET_MB else 'MISSED'}  "
        f"[wait4 ru_maxrss {run.maxrss_kb / 1024:.1f} MB]"
    )
    samples = run.timeline
    if samples:
        step = max(1, len(samples) // 8)
        shown = samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else [])
        print(
            "  timeline (s, done, VmRSS MB): "
            + "  ".join(f"{t:.0f}s {d}/{run.intents} {kb / 1024:.1f}" for t, d, kb in shown)
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with pinned_server(".tmp-bench-rss-", args.dir) as pinned:  # the drain children inherit it
        workdir, server, cpus = pinned.workdir, pinned.server, pinned.cpus
        print(f"command: {' '.join([sys.executable, *sys.argv])}")
        print(f"python {sys.version.split()[0]}, postonce {postonce.__version__}, cpus {cpus}")
        print(f"outbox fs {filesystem_of(workdir)}; server {server.url} (pid {server.pid})")
        print(f"pinning: {pinned.pinning}; load average at start: {os.getloadavg()}")
        print(f"{args.n:,} due intents, drain concurrency {args.concurrency}, via {args.via}")
        sys.stdout.flush()

        empty = workdir / "empty.sqlite3"
        fill_pending(empty, server.url, 0)
        base = drain_in_child("api", empty, args.concurrency, 0, args.every, args.timeout)
        print(
            f"baseline (api child, empty outbox): peak RSS {base.peak_kb / 1024:.1f} MB "
            f"[wait4 ru_maxrss {base.maxrss_kb / 1024:.1f} MB]"
        )

        runs: list[Run] = []
        for via in ("api", "cli") if args.via == "both" else (args.via,):
            outbox = workdir / f"outbox-{via}.sqlite3"
            took = fill_pending(outbox, server.url, args.n)
            size = sum(p.stat().st_size for p in workdir.glob(f"outbox-{via}.sqlite3*"))
            print(
                f"\nfilled {args.n:,} pending due intents in {took:.1f} s ({size / 2**20:.0f} MB)"
            )
            sys.stdout.flush()
            run = drain_in_child(via, outbox, args.concurrency, args.n, args.every, args.timeout)
            show(run, base.peak_kb)
            runs.append(run)
            sys.stdout.flush()

        print(f"\nload average at end: {os.getloadavg()}")
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"(ru_maxrss of a child also counts this process's RSS at spawn: this process "
            f"peaked at {mine:.1f} MB, RUSAGE_CHILDREN says {children:.1f} MB; VmHWM is exact)"
        )
        parts = "  ".join(
            f"{r.via}: peak {r.peak_kb / 1024:.0f} MB, "
            f"{r.intents / r.report['duration']:.0f} intents/s"
            for r in runs
        )
        worst = max(r.peak_kb for r in runs) / 1024
        print(
            f"SUMMARY rss drain {args.n:,} due c={args.concurrency}: {parts}; "
            f"baseline {base.peak_kb / 1024:.0f} MB; target < {TARGET_MB:.0f} MB: "
            f"{'met' if worst < TARGET_MB else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    run_main(main)
