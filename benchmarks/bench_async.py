"""Async throughput: ``AsyncClient.post_once`` against raw httpx and the async floor.

Run from the repository root::

    python benchmarks/bench_async.py                     # c=16,64, 3 repeats, ~2 min
    python benchmarks/bench_async.py --concurrency 64 --latency-ms 100   # a provider's round trip

Arms ``raw``, ``floor`` (``floor.AsyncFloor``, FULL) and ``postonce`` (FULL), each on
httpx's own transport and on httpx-aiohttp. A run that raises loses only itself: it
is printed ``FAILED`` and left out of every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

import aiohttp
import anyio
import httpx
from _harness import (
    BODY,
    Spread,
    check,
    common_args,
    finished,
    numbers,
    pinned_server,
    print_facts,
    run_main,
)
from floor import AsyncFloor
from httpx_aiohttp import AiohttpTransport

import postonce

Kind = Literal["raw", "floor", "postonce"]
TransportName = Literal["default", "aiohttp"]

KINDS: tuple[Kind, ...] = ("raw", "floor", "postonce")
TRANSPORTS: tuple[TransportName, ...] = ("default", "aiohttp")


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    transport: TransportName

    @property
    def name(self) -> str:
        return f"{self.kind}/{self.transport}"


@dataclass(frozen=True)
class RunResult:
    rate: float  # requests per second
    batches: int  # writer-thread transactions during the timed part (postonce only)
    calls: int  # writer-thread store calls during the timed part (postonce only)
    cpu: float = math.nan  # CPU seconds of this process (every thread) per timed request


@dataclass
class Results:
    rates: dict[tuple[int, Candidate], list[float]] = field(default_factory=dict)
    last: dict[tuple[int, Candidate], RunResult] = field(default_factory=dict)
    cpu: dict[tuple[int, Candidate], list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add(self, concurrency: int, candidate: Candidate, result: RunResult) -> None:
        self.rates.setdefault((concurrency, candidate), []).append(result.rate)
        self.cpu.setdefault((concurrency, candidate), []).append(result.cpu)
        self.last[(concurrency, candidate)] = result

    def fail(
        self, concurrency: int, candidate: Candidate, repeat: int, error: BaseException
    ) -> None:
        """A run that raised: NaN in its repeat's place, left out of every figure, and listed."""
        self.rates.setdefault((concurrency, candidate), []).append(math.nan)
        self.failures.append(
            f"{candidate.name} c={concurrency} repeat {repeat}: {type(error).__name__}"
        )

    def per_batch(self, concurrency: int, candidate: Candidate) -> float:
        """Store calls per writer transaction in the arm's last finished run (0 if none)."""
        last = self.last.get((concurrency, candidate))
        return last.calls / last.batches if last and last.batches else 0.0

    def failed(self, concurrency: int, candidate: Candidate) -> int:
        """How many of this arm's runs at this level failed."""
        return sum(math.isnan(rate) for rate in self.rates.get((concurrency, candidate), []))

    def empty(self) -> list[str]:
        """The arms (at a level) with no finished run: their figures are NaN."""
        return [
            f"{candidate.name} c={concurrency}"
            for (concurrency, candidate), rates in self.rates.items()
            if all(math.isnan(rate) for rate in rates)
        ]


#: What a run of the loopback benchmark may fail with and still leave the others
#: worth reading. Anything else (a TypeError, say) is the script's own bug: raised.
RUN_FAILURES = (httpx.HTTPError, OSError, TimeoutError, RuntimeError, postonce.PostonceError)


def run_failure(error: BaseException) -> bool:
    """Whether ``error`` is a failed run, not the script's bug; for a group (anyio's task
    groups wrap what their tasks raise), whether every error in it is."""
    inner = getattr(error, "exceptions", None)
    if isinstance(inner, tuple) and inner:
        return all(run_failure(one) for one in inner)
    return isinstance(error, RUN_FAILURES)


def make_http(transport: TransportName, concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    if transport == "aiohttp":
        return httpx.AsyncClient(transport=AiohttpTransport(limits=limits))
    return httpx.AsyncClient(limits=limits)


async def pool(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> None:
    """``requests`` calls from ``concurrency`` tasks pulling from one shared counter."""
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1  # no await between the test and the take: no race
            await call()

    async with anyio.create_task_group() as group:
        for _ in range(min(concurrency, requests)):
            group.start_soon(worker)


def _counters(client: postonce.AsyncClient | AsyncFloor | None) -> tuple[int, int]:
    """Transactions and the store calls (writes) in them, so far: group commit at work."""
    if isinstance(client, AsyncFloor):
        return client.batches, client.writes
    if client is None or client._thread is None:
        return 0, 0
    return client._thread.batches, client._thread.calls


async def run_candidate(
    candidate: Candidate,
    url: str,
    concurrency: int,
    requests: int,
    warmup: int,
    workdir: Path,
) -> RunResult:
    """One fresh client: warm up (untimed), then time ``requests`` calls."""
    http = make_http(candidate.transport, concurrency)
    path = workdir / f"{candidate.kind}-{candidate.transport}-c{concurrency}-{uuid.uuid4()}.db"
    client: postonce.AsyncClient | None = None
    floor: AsyncFloor | None = None
    who = f"{candidate.name} c={concurrency}"
    try:
        if candidate.kind == "raw":

            async def call() -> None:
                headers = {"Idempotency-Key": str(uuid.uuid4())}
                check(await http.post(url, json=BODY, headers=headers), who)

        elif candidate.kind == "floor":
            floor = made = AsyncFloor(path, "FULL", http)

            async def call() -> None:
                check(await made.post_once(url, BODY), who)

        else:
            client = once = postonce.AsyncClient(outbox=path, http=http)

            async def call() -> None:
                check(await once.post_once(url, json=BODY, intent=postonce.ONE_OFF), who)

        if warmup:
            await pool(call, warmup, concurrency)
        batches_before, calls_before = _counters(client or floor)
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        await pool(call, requests, concurrency)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        batches, calls = _counters(client or floor)
        return RunResult(
            requests / elapsed, batches - batches_before, calls - calls_before, cpu / requests
        )
    finally:
        with anyio.CancelScope(shield=True):
            if client is not None:
                await client.aclose()  # http= is ours: postonce leaves it open
            if floor is not None:
                floor.close()
            await http.aclose()


async def run_all(
    args: argparse.Namespace, levels: Sequence[int], url: str, workdir: Path
) -> Results:
    results = Results()
    rng = random.Random(args.seed)
    candidates = [Candidate(kind, transport) for transport in TRANSPORTS for kind in KINDS]
    for repeat in range(args.repeats):
        for concurrency in levels:
            order = list(candidates)
            rng.shuffle(order)
            line: list[str] = []
            for candidate in order:
                try:
                    with anyio.fail_after(args.run_timeout):
                        result = await run_candidate(
                            candidate, url, concurrency, args.requests, args.warmup, workdir
                        )
                except Exception as exc:
                    if not run_failure(exc):
                        raise
                    # One arm's failure (a transport error, the timeout) loses only its run.
                    results.fail(concurrency, candidate, repeat + 1, exc)
                    line.append(f"{candidate.name} FAILED ({type(exc).__name__})")
                    continue
                results.add(concurrency, candidate, result)
                line.append(f"{candidate.name} {result.rate:.0f}/s")
            print(f"repeat {repeat + 1} c={concurrency:<3} " + "  ".join(line), flush=True)
    return results


COLLAPSE = 0.8  # raw below 0.8x its own rate at a lower concurrency: its pool is the limit


def rates(results: Results, concurrency: int, kind: Kind, transport: TransportName) -> Spread:
    return finished(results.rates[(concurrency, Candidate(kind, transport))])


def ratio_spread(
    results: Results,
    concurrency: int,
    transport: TransportName,
    kind: Kind = "postonce",
    against: Kind = "raw",
) -> Spread:
    """``kind`` / ``against`` throughput, computed within each repeat (they ran side by side)."""
    top = results.rates[(concurrency, Candidate(kind, transport))]
    bottom = results.rates[(concurrency, Candidate(against, transport))]
    return finished(t / b for t, b in zip(top, bottom, strict=True))  # a failed run's is NaN


def _best(medians: Iterable[float]) -> float:
    """The highest of the medians that are figures (NaN when none is)."""
    figures = [median for median in medians if not math.isnan(median)]
    return max(figures) if figures else math.nan


def report(results: Results, levels: Sequence[int]) -> None:
    print(
        f"\n{'conc':>4}  {'transport':<9}{'raw req/s':>24}{'floor req/s':>24}"
        f"{'postonce req/s':>24}{'postonce/raw':>24}{'floor/raw':>24}"
        f"{'postonce/floor':>24}{'calls/batch':>13}{'floor w/batch':>15}"
    )
    for concurrency in levels:
        for transport in TRANSPORTS:
            per_batch, floor_per_batch = (
                results.per_batch(concurrency, Candidate(kind, transport))
                for kind in ("postonce", "floor")
            )
            print(
                f"{concurrency:>4}  {transport:<9}"
                f"{rates(results, concurrency, 'raw', transport).text():>24}"
                f"{rates(results, concurrency, 'floor', transport).text():>24}"
                f"{rates(results, concurrency, 'postonce', transport).text():>24}"
                f"{ratio_spread(results, concurrency, transport).text('.2f'):>24}"
                f"{ratio_spread(results, concurrency, transport, 'floor').text('.2f'):>24}"
                f"{ratio_spread(results, concurrency, transport, against='floor').text('.2f'):>24}"
                f"{per_batch:>13.1f}{floor_per_batch:>15.1f}"
            )
    print(
        "(req/s: min/median/max over the repeats; ratios within each repeat; calls/batch, "
        "floor w/batch: store calls per transaction in the last run of each)\n"
    )
    low, top = min(levels), max(levels)
    crippled = False
    for transport in TRANSPORTS:
        raw_low = rates(results, low, "raw", transport).median
        raw_top = rates(results, top, "raw", transport).median
        line = f"raw {transport}: c={low} {raw_low:.0f} req/s, c={top} {raw_top:.0f} req/s"
        raw_failed = results.failed(top, Candidate("raw", transport))
        collapsed = raw_top < COLLAPSE * raw_low or math.isnan(raw_top)
        if top > low and (collapsed or raw_failed):
            seen = f"x{raw_top / raw_low:.2f} of c={low}"
            if math.isnan(raw_top / raw_low):
                seen = "no finished run"
            if raw_failed:
                seen += f"; {raw_failed} of its runs failed"
            line += (
                f"  FLAG: raw collapses at c={top} ({seen}): its "
                f"own pool is the limit, so postonce/raw at c={top} on {transport} does not "
                "measure postonce; compare with raw at the lower concurrency"
            )
            crippled = crippled or transport == "default"
        print(line)
    # Over the levels with a finished run (a NaN would make max() depend on order).
    best_raw = _best(rates(results, c, "raw", "default").median for c in levels)
    best_once = _best(rates(results, c, "postonce", "default").median for c in levels)
    print(
        f"default transport, best level against best level: postonce {best_once:.0f} req/s / "
        f"raw {best_raw:.0f} req/s = x{best_once / best_raw:.2f}"
    )
    aio = ratio_spread(results, top, "aiohttp")
    aio_floor = ratio_spread(results, top, "aiohttp", "floor")
    print(
        f"httpx-aiohttp c={top}: postonce/raw {aio.text('.2f')}"
        f"{' (not measured: no repeat finished both arms)' if math.isnan(aio.median) else ''}; "
        f"the floor itself reaches {aio_floor.text('.2f')} of raw"
    )
    cpu = {
        kind: 1e6 * finished(results.cpu.get((top, Candidate(kind, "aiohttp")), [])).median
        for kind in KINDS
    }
    print(
        f"client CPU per request, httpx-aiohttp c={top} (median, every thread of the client, "
        f"which runs on one CPU): raw {cpu['raw']:.0f} us, floor {cpu['floor']:.0f} us, "
        f"postonce {cpu['postonce']:.0f} us"
    )
    unstable = [
        f"{kind}/{transport} c={c}"
        for c in levels
        for transport in TRANSPORTS
        for kind in KINDS
        if rates(results, c, kind, transport).unstable
    ]
    if unstable:
        print(f"UNSTABLE (repeats differ by > 30%): {', '.join(unstable)}")
    if results.failures:
        print(f"FAILED runs, left out of every figure: {'; '.join(results.failures)}")
    if results.empty():
        print(f"NO FINISHED RUN (figures are nan): {', '.join(results.empty())}")
    default = " ".join(
        f"raw c={c} {rates(results, c, 'raw', 'default').median:.0f}/s "
        f"postonce c={c} {rates(results, c, 'postonce', 'default').median:.0f}/s"
        for c in levels
    )
    print(
        f"SUMMARY async: aiohttp c={top} postonce/raw x{aio.median:.2f}, floor/raw "
        f"x{aio_floor.median:.2f}, postonce/floor "
        f"x{ratio_spread(results, top, 'aiohttp', against='floor').median:.2f}; default transport "
        f"{default}{' (raw crippled at c=' + str(top) + ')' if crippled else ''}; "
        f"best default postonce/best default raw x{best_once / best_raw:.2f}; "
        f"unstable: {', '.join(unstable) or 'none'}; failed runs: {len(results.failures)}"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", type=numbers, default="16,64", help="comma-separated")
    parser.add_argument("--requests", type=int, default=1500, help="timed requests per run")
    parser.add_argument("--warmup", type=int, default=200, help="untimed requests before each run")
    parser.add_argument("--run-timeout", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="the server's, per answer")
    common_args(parser)
    args = parser.parse_args(argv)
    if min(args.requests, args.repeats, *args.concurrency) < 1 or args.warmup < 0:
        parser.error("--requests, --repeats, --concurrency must be >= 1, --warmup >= 0")
    if not 0 <= args.latency_ms < math.inf:
        parser.error("--latency-ms must be a finite number >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    levels: list[int] = args.concurrency
    with pinned_server(".tmp-async-", args.dir, args.latency_ms / 1000) as pinned:
        print_facts(
            pinned,
            f"aiohttp {aiohttp.__version__}, httpx-aiohttp {metadata.version('httpx-aiohttp')}",
            f"{args.requests} timed requests (+{args.warmup} warm-up) per run, "
            f"{args.repeats} repeats, seed {args.seed}, event loop: asyncio, server latency "
            f"{args.latency_ms} ms",
        )
        started = time.monotonic()
        results = asyncio.run(run_all(args, levels, pinned.server.url, pinned.workdir))
        print(f"measured in {time.monotonic() - started:.1f} s")
        report(results, levels)
    return 1 if results.empty() else 0  # an arm with no figure at all: the run failed


if __name__ == "__main__":
    run_main(main)
