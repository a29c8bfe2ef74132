"""Drain throughput: due intents finished per second, against raw httpx and the drain floor.

Run from the repository root::

    python benchmarks/bench_drain.py                               # SQLite, c=1,4,8
    python benchmarks/bench_drain.py --backend postgres            # PostgreSQL (--pg URL)
    python benchmarks/bench_drain.py --catch-up 100000 --concurrency 16   # after an outage
    python benchmarks/bench_drain.py --intents 200 --concurrency 4 --repeats 1   # a smoke run

Arms: ``drain`` (``Client.drain``), ``floor`` (``floor.drain_floor``), ``raw`` (httpx
from C threads); ``--shell async``: ``AsyncClient.drain`` against raw
``httpx.AsyncClient``. ``--catch-up N``: a backlog of N due intents drained instead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import random
import resource
import statistics
import sys
import time
import uuid
from array import array
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from _harness import Spread, common_args, numbers, pinned_server, print_facts, run_main
from floor import drain_floor

import postonce
from postonce._outbox.base import NewIntent
from postonce._outbox.locate import open_store, split_schema

BODY = json.dumps({"amount": 1250, "currency": "eur", "customer": "cus_1"}).encode()


class Used(NamedTuple):
    """What the client process spent on a run, per intent."""

    cpu_us: float  # user + system CPU, every thread of this process
    waits: float  # voluntary context switches: a thread blocked (a socket, a lock, the GIL)
    preempted: float  # involuntary ones: a thread taken off the CPU while it could run


def client_usage() -> Any:
    """This process's use so far: CPU (user, system) and context switches, all its threads."""
    return resource.getrusage(resource.RUSAGE_SELF)


class Timed:
    """One timed run: its wall time, and what the client spent over the very same span."""

    def __init__(
        self,
        count: int,
        *,
        clock: Callable[[], float] = time.perf_counter,
        usage: Callable[[], Any] = client_usage,
    ) -> None:
        self.count = count
        self._clock = clock
        self._usage = usage

    def __enter__(self) -> Timed:
        self._before = self._usage()
        self._started = self._clock()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.elapsed = self._clock() - self._started
        after, before = self._usage(), self._before
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        self.used = Used(
            cpu / self.count * 1e6,
            (after.ru_nvcsw - before.ru_nvcsw) / self.count,
            (after.ru_nivcsw - before.ru_nivcsw) / self.count,
        )

    @property
    def rate(self) -> float:
        """Intents (or requests) per second."""
        return self.count / self.elapsed


def cpu_line(rates: dict[str, list[float]], used: dict[str, list[Used]]) -> str:
    """Each arm's client CPU per intent beside its wall time, and its switches (medians)."""
    parts = []
    for arm, runs in used.items():
        wall = 1e6 / statistics.median(rates[arm])
        spent = statistics.median(run.cpu_us for run in runs)
        waits = statistics.median(run.waits for run in runs)
        preempted = statistics.median(run.preempted for run in runs)
        parts.append(
            f"{arm} {spent:.0f} of {wall:.0f} (busy {spent / wall:.0%}, "
            f"switches {waits:.1f} waiting + {preempted:.1f} preempted)"
        )
    return "client CPU per intent, us of wall: " + "   ".join(parts)


def sender_of(url: str) -> str:
    """The sender a drain client with ``base_url`` at ``url``'s origin sends as."""
    return postonce.Client(outbox=":memory:", base_url=origin_of(url)).sender


def make_intent(reference: str, url: str, fingerprint: str, sender: str | None = None) -> NewIntent:
    """A benchmark intent to open; with ``sender``, a drain's for ``url``'s origin."""
    return NewIntent(
        reference=reference, key=str(uuid.uuid4()), key_given=False, provider="ietf_draft",
        method="POST", url=url, headers=(("content-type", "application/json"),), body=BODY,
        fingerprint=fingerprint, deadline_at=None, sender=sender,
        origin=origin_of(url) if sender else None,
    )  # fmt: skip


def fill(path: Path | str, url: str, count: int, shape: str = "crash") -> None:
    """``count`` due intents leased by a dead owner, expired (``outage``: handed back)."""
    store = open_store(str(path), durability="normal")
    long_ago, sender = time.time() - 3600, sender_of(url)
    run_batch = getattr(store, "run_batch")  # noqa: B009 (both stores have it)
    ahead = {"owner": "dead/0", "now": long_ago, "lease_for": 1.0}  # a lease long run out
    for start in range(0, count, 1000):
        calls = [
            ("open_intent", {"new": make_intent(f"bench-{i}", url, f"{i:064x}", sender), **ahead})
            for i in range(start, min(start + 1000, count))
        ]
        opened = [checked(ok, result) for ok, result in run_batch(calls)]
        if shape == "outage":
            release_all(store, opened, due_at=long_ago)
    store.close()


def checked(ok: bool, result: Any) -> Any:
    if not ok:
        raise RuntimeError(f"a store call failed: {result!r}")
    return result


def release_all(
    store: Any, claimed: Sequence[Any], due_at: float | None = None, as_before: bool = False
) -> None:
    """Hand claims back due at ``due_at`` (``as_before``: as they were, as a drain stopping)."""
    now, calls = time.time(), []
    for o in claimed:
        due, anchor = (o.record.due_at, o.anchor_before) if as_before else (due_at, None)
        calls.append(("release", {"lease": o.lease, "now": now, "due_at": due, "anchor": anchor}))
    for ok, result in store.run_batch(calls):
        checked(ok and result is True, result)


class Noting(httpx.BaseTransport):
    """Notes when each request was answered and its key, compactly: the RSS is the drain's."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.times, self.keys = inner, array("d"), bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        response.read()
        self.keys += uuid.UUID(request.headers["idempotency-key"]).bytes
        self.times.append(time.time())
        return response

    def close(self) -> None:
        self.inner.close()


class Drained(NamedTuple):
    """What one catch-up drain process reports."""

    times: array[float]  # when each answer came (time.time())
    keys: bytes  # the key each request carried, 16 bytes each
    peak_mb: float  # its peak RSS (VmHWM)
    cpu_s: float  # its user + system CPU
    late: bool  # not ready by the start time: its first tenth is not comparable


def catch_up_child(spec: str, url: str, concurrency: int, transport: str, go_at: float) -> Drained:
    """One drain process: open the outbox, start at ``go_at``, drain until nothing is due."""
    os.sched_setaffinity(0, range(os.cpu_count() or 1))  # processes share every CPU
    if transport == "in-process":
        inner: httpx.BaseTransport = httpx.MockTransport(lambda _: httpx.Response(201, json={}))
    else:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        inner = httpx.HTTPTransport(limits=limits)
    noting = Noting(inner)
    with postonce.Client(outbox=spec, base_url=origin_of(url), transport=noting) as client:
        client.outbox  # noqa: B018 (opened before the start)
        late = time.time() > go_at
        time.sleep(max(0.0, go_at - time.time()))
        client.drain(concurrency=concurrency)
    status = Path("/proc/self/status").read_text()
    used = client_usage()
    peak = int(status.split("VmHWM:")[1].split()[0]) / 1024
    return Drained(noting.times, bytes(noting.keys), peak, used.ru_utime + used.ru_stime, late)


def claim_p50(spec: str, url: str, samples: int = 5) -> float:
    """A drain's claim of 32 on the backlog as filled, in us (each handed back untimed)."""
    store, sender, origins = open_store(spec), sender_of(url), [origin_of(url)]
    taken = []
    for _ in range(samples):
        started = time.perf_counter()
        claimed = store.claim_due(
            owner="bench/claim", now=time.time(), limit=32, lease_for=60.0,
            sender=sender, origins=origins,
        )  # fmt: skip
        taken.append((time.perf_counter() - started) * 1e6)
        release_all(store, claimed)
    store.close()
    return statistics.median(taken)


def catch_up(
    args: argparse.Namespace, url: str, spec: str, run: tuple[str, str, int, int]
) -> tuple[str, float]:
    """Fill ``spec``, drain it with ``processes`` processes: a result line, last/first tenth."""
    shape, transport, processes, concurrency = run
    count = args.catch_up
    fill(spec, url, count, shape)
    claim_us = claim_p50(spec, url)
    go_at = time.time() + 2.0 + processes  # every process has opened its outbox by then
    with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
        runs = [
            pool.submit(catch_up_child, spec, url, concurrency, transport, go_at)
            for _ in range(processes)
        ]
        drained = [run.result() for run in runs]
    times = sorted(t for d in drained for t in d.times)
    keys = [d.keys[at : at + 16] for d in drained for at in range(0, len(d.keys), 16)]
    if len(keys) != count or len(set(keys)) != count:
        raise RuntimeError(f"{len(keys)} sends of {len(set(keys))} keys for {count} intents")
    tenth = count // 10
    first, last = tenth / (times[tenth - 1] - go_at), tenth / (times[-1] - times[-tenth - 1])
    cpu = sum(d.cpu_s for d in drained) / count * 1e6
    late = " (a process started LATE)" if any(d.late for d in drained) else ""
    line = (
        f"  {shape:<7}{transport:<11}{processes:>3} x c={concurrency:<4}{claim_us:>10,.0f} us"
        f"{first:>10,.0f}/s{last:>10,.0f}/s  x{last / first:.2f}"
        f"{max(d.peak_mb for d in drained):>8.0f} MB{cpu:>8.0f} us  "
        f"{count / (times[-1] - go_at):,.0f}/s overall, every intent sent once{late}"
    )
    return line, last / first


def catch_up_main(args: argparse.Namespace, pinned: Any) -> int:
    print(
        f"catch-up: {args.catch_up:,} due intents per run; loopback latency {args.latency_ms} ms\n"
        "  shape  transport  procs x conc   claim p50  first tenth  last tenth  last/first"
        "  peak RSS  CPU/intent"
    )
    worst = math.inf
    for run in itertools.product(args.shapes, args.transports, args.processes, args.concurrency):
        with scratch_outbox(args, pinned.workdir, "catch-up") as spec:
            line, ratio = catch_up(args, pinned.server.url, spec, run)
        print(line)
        sys.stdout.flush()
        worst = min(worst, ratio)
    word = "met" if worst >= 0.8 else "MISSED"
    print(
        f"SUMMARY catch-up {args.backend}: last/first tenth >= 0.80 in every run: "
        f"x{worst:.2f} {word}"
    )
    return 0


def fresh_postgres(base: str) -> str:
    """A PostgreSQL outbox URL in a new schema (dropped by drop_postgres)."""
    return f"{base}?schema=bench_{uuid.uuid4().hex[:10]}"


@contextmanager
def scratch_outbox(args: argparse.Namespace, workdir: Path, name: str) -> Iterator[str]:
    """A new SQLite file in ``workdir`` or PostgreSQL schema at ``args.pg``, removed after."""
    if args.backend == "postgres":
        spec = fresh_postgres(args.pg)
        try:
            yield spec
        finally:
            drop_postgres(spec)
        return
    spec = str(workdir / f"{name}-{uuid.uuid4().hex[:8]}.sqlite3")
    try:
        yield spec
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(spec + suffix).unlink(missing_ok=True)


def drop_postgres(url: str) -> None:
    import psycopg
    from psycopg import sql

    base, schema = split_schema(url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``: the drain client's base_url (it sends only there)."""
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.host}:{parsed.port}"


def time_drain(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    with postonce.Client(outbox=path, durability="full", base_url=origin_of(url)) as client:
        client.outbox  # noqa: B018 (opened before the clock starts, as raw's pool)
        with Timed(count) as timed:
            report = client.drain(concurrency=concurrency)
    if report.succeeded != count:
        raise RuntimeError(f"drain finished {report.succeeded} of {count}: {report}")
    return timed


def time_floor(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(limits=limits) as http, Timed(count) as timed:
        done = drain_floor(str(path), http, concurrency)
    if done != count:
        raise RuntimeError(f"the floor finished {done} of {count}")
    return timed


def raw_headers() -> dict[str, str]:
    return {"content-type": "application/json", "Idempotency-Key": str(uuid.uuid4())}


def time_raw(url: str, concurrency: int, count: int) -> Timed:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(limits=limits) as http:

        def one(_: int) -> None:
            http.post(url, content=BODY, headers=raw_headers()).raise_for_status()

        with Timed(count) as timed:
            if concurrency == 1:
                for i in range(count):
                    one(i)
            else:
                with ThreadPoolExecutor(concurrency) as pool:
                    list(pool.map(one, range(count)))
        return timed


def time_drain_async(path: Path | str, url: str, concurrency: int, count: int) -> Timed:
    async def run() -> Timed:
        async with postonce.AsyncClient(
            outbox=path, durability="full", base_url=origin_of(url)
        ) as client:
            await client.lookup("opened before the clock starts")  # opens the outbox
            with Timed(count) as timed:
                report = await client.drain(concurrency=concurrency)
        if report.succeeded != count:
            raise RuntimeError(f"drain finished {report.succeeded} of {count}: {report}")
        return timed

    return asyncio.run(run())


def time_raw_async(url: str, concurrency: int, count: int) -> Timed:
    async def run() -> Timed:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits) as http:
            left = iter(range(count))

            async def worker() -> None:
                for _ in left:
                    (await http.post(url, content=BODY, headers=raw_headers())).raise_for_status()

            with Timed(count) as timed:
                await asyncio.gather(*(worker() for _ in range(concurrency)))
            return timed

    return asyncio.run(run())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--intents", type=int, default=3000, help="per run (default 3000)")
    parser.add_argument("--concurrency", type=numbers, default="1,4,8", help="comma-separated")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--shell", choices=["sync", "async"], default="sync")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--catch-up", type=int, default=0, help="backlog size (0: the arms)")
    parser.add_argument("--shapes", default="crash,outage", help="catch-up: backlog shapes")
    parser.add_argument("--transport", default="in-process,loopback", help="catch-up")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="catch-up: loopback")
    parser.add_argument("--processes", type=numbers, default="1", help="catch-up: 1,2,4 ...")
    common_args(parser, seed=7)
    args = parser.parse_args(argv)
    args.shapes, args.transports = args.shapes.split(","), args.transport.split(",")
    if min(args.intents, args.repeats, *args.concurrency, *args.processes) < 1:
        parser.error("--intents, --repeats, every concurrency and process count must be >= 1")
    return args


def time_arm(arm: str, args: argparse.Namespace, url: str, workdir: Path, c: int) -> Timed:
    """One timed run of ``arm`` (a drain on a freshly filled outbox, removed after)."""
    if arm == "raw":
        return (time_raw if args.shell == "sync" else time_raw_async)(url, c, args.intents)
    timer = {"drain": time_drain, "floor": time_floor}[arm]
    with scratch_outbox(args, workdir, f"{arm}-c{c}") as outbox:
        fill(outbox, url, args.intents)
        return (time_drain_async if args.shell == "async" else timer)(outbox, url, c, args.intents)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    arms = ["drain", "raw"] + (["floor"] if args.shell == "sync" else [])
    results: dict[int, dict[str, list[float]]] = {}
    latency = args.latency_ms / 1000 if args.catch_up else 0.0
    with pinned_server(".tmp-drain-", args.dir, latency) as pinned:
        if args.catch_up:
            print_facts(pinned, f"backend {args.backend}")
            return catch_up_main(args, pinned)
        print_facts(
            pinned,
            f"backend {args.backend}, shell {args.shell}, {args.intents} intents per run, "
            f"{args.repeats} repeats, seed {args.seed}",
        )
        url = pinned.server.url
        for c in args.concurrency:
            runs: dict[str, list[float]] = {arm: [] for arm in arms}
            cpu: dict[str, list[Used]] = {arm: [] for arm in arms}
            for _ in range(args.repeats):
                for arm in rng.sample(arms, len(arms)):
                    timed = time_arm(arm, args, url, pinned.workdir, c)
                    runs[arm].append(timed.rate)
                    cpu[arm].append(timed.used)
            results[c] = runs
            print(f"concurrency {c}: intents/s min/median/max over the repeats")
            for arm, rates in runs.items():
                print(f"  {arm:<6}{Spread.of(rates).text():>28}")
            pairs = [("drain", "raw")]
            if "floor" in runs:
                pairs += [("drain", "floor"), ("floor", "raw")]
            ratios = [f"{t}/{b} {paired(runs, b, t).text('.2f')}" for t, b in pairs]
            print(f"  {'   '.join(ratios)}   (within each repeat)\n  {cpu_line(runs, cpu)}")
            sys.stdout.flush()
    parts = []
    for c, runs in results.items():
        part = (
            f"c={c}: {statistics.median(runs['drain']):.0f}/s x{paired(runs, 'raw').median:.2f} raw"
        )
        if "floor" in runs:
            part += f", x{paired(runs, 'floor').median:.2f} floor"
        parts.append(part)
    unstable = [
        f"{arm} c={c}" for c, r in results.items() for arm in r if Spread.of(r[arm]).unstable
    ]
    print(
        f"SUMMARY drain {args.backend} {args.shell}: {'  '.join(parts)}; "
        f"unstable: {', '.join(unstable) or 'none'}"
    )
    return 0


def paired(runs: dict[str, list[float]], bottom: str, top: str = "drain") -> Spread:
    """``top / bottom`` intents per second, within each repeat (they ran side by side)."""
    return Spread.of(t / b for t, b in zip(runs[top], runs[bottom], strict=True))


if __name__ == "__main__":
    run_main(main)
