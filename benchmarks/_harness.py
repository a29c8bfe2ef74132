"""What every benchmark script shares: the loopback server, the machine's facts, timing, spreads.

The server is a raw asyncio HTTP/1.1 keep-alive server (not uvicorn: its parser adds
~300 us a request) in its own process on the second CPU, this process on the first.
Nothing is ever asserted about a timing: the scripts only print.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import platform
import random
import shlex
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import httpx

import postonce

BODY: dict[str, object] = {
    "amount": 1250,
    "currency": "eur",
    "customer": "cus_0000000000000001",
    "description": "postonce benchmark",
}
UNSTABLE_SPREAD = 0.30
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
HERE = Path(__file__).resolve().parent

_ANSWER = b'{"id":"ch_0000000000000001","status":"created"}'
_RESPONSE_201 = (
    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(_ANSWER)).encode() + b"\r\n\r\n" + _ANSWER
)
_RESPONSE_405 = b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    at = (len(ordered) - 1) * q / 100
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@dataclass(frozen=True)
class Spread:
    """One figure measured once per repeat."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        kept = tuple(values)
        if not kept:
            raise ValueError("a spread needs at least one repeat")
        return cls(kept)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def unstable(self) -> bool:
        """More than one repeat, and the largest more than 30% above the smallest."""
        low = self.min
        return len(self.values) > 1 and (low <= 0 or (self.max - low) / low > UNSTABLE_SPREAD)

    def text(self, fmt: str = ".0f", *, flag: bool = True) -> str:
        """``min/median/max``, `` UNSTABLE`` appended when the repeats disagree."""
        body = f"{self.min:{fmt}}/{self.median:{fmt}}/{self.max:{fmt}}"
        return body + (" UNSTABLE" if flag and self.unstable else "")


def finished(values: Iterable[float]) -> Spread:
    """The spread of the values that are figures (a failed run's NaN left out; NaN if none)."""
    kept = [v for v in values if not math.isnan(v)]
    return Spread.of(kept or [math.nan])


def target_line(name: str, ratio: float, target: float, *spreads: Spread) -> str:
    """A target, printed, never asserted: met / MISSED, qualified when a figure is unstable."""
    if math.isnan(ratio):
        word = "not measured"
    else:
        word = "met" if ratio <= target else "MISSED"
        if any(s.unstable for s in spreads):
            word += ", but UNSTABLE: re-run before quoting it"
    return f"target {name} <= {target:.2f}x: x{ratio:.2f} {word}"


class _HTTPProtocol(asyncio.Protocol):
    """Just enough HTTP/1.1: keep-alive, Content-Length bodies, pipelining."""

    def __init__(self, latency: float) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._latency = latency  # seconds before each answer, as a distant provider

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while (end := buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(buffer[:end]).lower()
            length = 0
            if (at := head.find(b"\r\ncontent-length:")) >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else None])
            if len(buffer) < end + 4 + length:
                return
            del buffer[: end + 4 + length]
            answer = _RESPONSE_201 if head.startswith(b"post ") else _RESPONSE_405
            closing = b"\r\nconnection: close" in head
            if self._latency:
                asyncio.get_running_loop().call_later(self._latency, self._answer, answer, closing)
            else:
                self._answer(answer, closing)
            if closing:
                return

    def _answer(self, answer: bytes, closing: bool) -> None:
        assert self._transport is not None
        self._transport.write(answer)
        if closing:
            self._transport.close()


async def _serve(link: Connection, latency: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _HTTPProtocol(latency), "127.0.0.1", 0, backlog=512)
    link.send((int(server.sockets[0].getsockname()[1]), os.getpid()))
    gone: asyncio.Future[None] = loop.create_future()

    def parent_gone() -> None:  # the parent never writes: readable only at EOF, when it died
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(link.fileno(), parent_gone)
    try:
        await gone
    finally:
        server.close()


def _server_main(link: Connection, cpu: int | None, latency: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this ends
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    gc.disable()
    asyncio.run(_serve(link, latency))


@dataclass
class ServerProcess:
    url: str  # http://127.0.0.1:PORT/v1/charges
    pid: int
    _process: BaseProcess
    _link: Connection

    @property
    def origin(self) -> str:
        return self.url.rsplit("/v1/", 1)[0]

    def stop(self) -> None:
        self._link.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)


def start_server(cpu: int | None, latency: float = 0.0) -> ServerProcess:
    ctx = get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=True)
    process = ctx.Process(target=_server_main, args=(child_end, cpu, latency), daemon=True)
    process.start()
    child_end.close()
    server = ServerProcess("", 0, process, parent_end)
    try:
        if not parent_end.poll(15.0):
            raise RuntimeError("the loopback server did not start in time")
        port, server.pid = parent_end.recv()
    except BaseException:
        server.stop()
        raise
    server.url = f"http://127.0.0.1:{port}/v1/charges"
    return server


def filesystem_of(path: Path) -> tuple[str, str]:
    """(fstype, mount point) of the mount holding ``path``, from /proc/mounts."""
    target, best = str(path.resolve()), ("unknown", "")
    with suppress(OSError):
        for _, mount, fstype, *_ in map(str.split, Path("/proc/mounts").read_text().splitlines()):
            mount = mount.replace("\\040", " ")
            inside = target == mount or target.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best[1]):
                best = (fstype, mount)
    return best


@dataclass(frozen=True)
class Pinned:
    workdir: Path
    server: ServerProcess
    pinning: str


@contextmanager
def pinned_server(prefix: str, parent: Path | None, latency: float = 0.0) -> Iterator[Pinned]:
    """A fresh work directory, the server (answering after ``latency`` s) on the second CPU
    and this process on the first."""
    cpus = sorted(os.sched_getaffinity(0))  # Linux, as /proc/mounts
    pin = len(cpus) >= 2
    parent = parent or HERE
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    server: ServerProcess | None = None
    try:
        server = start_server(cpus[1] if pin else None, latency)
        if pin:
            os.sched_setaffinity(0, {cpus[0]})  # children (drain processes) inherit it
        pinning = f"client CPU {cpus[0]}, server CPU {cpus[1]}" if pin else "off (one CPU)"
        yield Pinned(workdir, server, pinning)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def print_facts(pinned: Pinned, *extra: str) -> None:
    fstype, mount = filesystem_of(pinned.workdir)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"python {sys.version.split()[0]}, {platform.platform()}")
    print(f"cpus: {os.cpu_count()}, pinning: {pinned.pinning}; load average {os.getloadavg()}")
    print(
        f"postonce {postonce.__version__}, httpx {httpx.__version__}, "
        f"sqlite {sqlite3.sqlite_version}"
    )
    print(f"outbox dir: {pinned.workdir} on {fstype} (mount {mount})")
    if fstype in RAM_FILESYSTEMS:
        print("WARNING: the outbox dir is on a RAM filesystem: fsync is free, FULL means nothing")
    print(f"server: raw asyncio HTTP/1.1 keep-alive, pid {pinned.server.pid}, {pinned.server.url}")
    for line in extra:
        print(line)
    sys.stdout.flush()


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the clean-up: server stopped, dir removed


def run_main(main: Callable[[], int]) -> None:
    """Run a script's ``main`` and exit with its code; SIGTERM and Ctrl-C clean up first."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


def numbers(text: str) -> list[int]:
    """A comma-separated list of whole numbers, as an argparse ``type`` ("1,4,8")."""
    return [int(part) for part in text.split(",")]


def common_args(parser: argparse.ArgumentParser, repeats: int = 3, seed: int = 12345) -> None:
    parser.add_argument("--repeats", type=int, default=repeats, help=f"(default {repeats})")
    parser.add_argument("--seed", type=int, default=seed, help="seed of the order of the arms")
    parser.add_argument(
        "--dir", type=Path, default=None, help="parent of the work directory (default benchmarks/)"
    )


def check(response: httpx.Response, who: str) -> None:
    if response.status_code != 201:
        raise RuntimeError(f"{who}: expected 201 from the loopback server, got {response}")


@dataclass
class Candidate:
    """One arm: a call, timed; ``settle`` waits for work a call leaves behind (counted)."""

    name: str
    call: Callable[[], None]
    settle: Callable[[], None] | None = None
    block: int | None = None  # calls in a row, if not the script's (a slow peer: 1)
    samples: list[int] = field(default_factory=list)  # ns, the current repeat
    repeats: list[list[int]] = field(default_factory=list)


def run_rounds(
    candidates: Sequence[Candidate], rounds: int, rng: random.Random, keep: bool, block: int
) -> None:
    """``rounds`` rounds of ``block`` calls in a row per arm, arms shuffled; a block's last
    sample holds its ``settle`` (what the calls left pending)."""
    order = list(candidates)
    clock = time.perf_counter_ns
    for _ in range(rounds):
        rng.shuffle(order)
        for candidate in order:
            calls = candidate.block or block
            for i in range(calls):
                started = clock()
                candidate.call()
                if i == calls - 1 and candidate.settle is not None:
                    candidate.settle()
                if keep:
                    candidate.samples.append(clock() - started)


def measure(candidates: Sequence[Candidate], args: argparse.Namespace) -> None:
    """``args.warmup`` uncounted rounds, then ``args.repeats`` repeats of ``args.rounds``."""
    rng = random.Random(args.seed)
    run_rounds(candidates, args.warmup, rng, False, args.block)
    gc.collect()
    started = time.monotonic()
    for number in range(1, args.repeats + 1):
        run_rounds(candidates, args.rounds, rng, True, args.block)
        for candidate in candidates:
            candidate.repeats.append(candidate.samples)
            candidate.samples = []
        print(f"repeat {number}/{args.repeats} done at {time.monotonic() - started:.1f} s")
        sys.stdout.flush()


def _us(samples: Sequence[int], q: float) -> float:
    return percentile((s / 1000 for s in samples), q)


def ratio(top: Candidate, bottom: Candidate, q: float) -> Spread:
    """``top / bottom`` at percentile ``q``, computed within each repeat (they ran side by side)."""
    return Spread.of(
        _us(a, q) / _us(b, q) for a, b in zip(top.repeats, bottom.repeats, strict=True)
    )


def latency_report(candidates: Sequence[Candidate], floor_of: dict[str, str]) -> list[str]:
    """Print the latency table and the ratios to raw and to ``floor_of[arm]``; the SUMMARY."""
    by_name = {c.name: c for c in candidates}
    raw = by_name["raw httpx"]
    print("\nper-call latency in us, all repeats pooled; p50 and p99 per repeat min/median/max")
    print(
        f"{'arm':<17}{'n':>6}{'min':>7}{'p50':>7}{'p99':>8}{'max':>8}   "
        f"{'p50 per repeat':<26}p99 per repeat"
    )
    per_repeat = {
        c.name: [Spread.of(_us(r, q) for r in c.repeats) for q in (50, 99)] for c in candidates
    }
    for c in candidates:
        pooled = [s for repeat in c.repeats for s in repeat]
        p50, p99 = per_repeat[c.name]
        print(
            f"{c.name:<17}{len(pooled):>6}{_us(pooled, 0):>7.0f}{_us(pooled, 50):>7.0f}"
            f"{_us(pooled, 99):>8.0f}{_us(pooled, 100):>8.0f}   {p50.text():<26}{p99.text()}"
        )
    print("\nratios within each repeat, min/median/max over the repeats")
    unstable = [c.name for c in candidates if any(s.unstable for s in per_repeat[c.name])]
    print(f"{'arm':<17}{'p50/raw':<26}{'p99/raw':<26}{'p50/floor':<26}floor")
    summary = [f"raw p50 {_us([s for r in raw.repeats for s in r], 50):.0f}us"]
    for c in candidates:
        if c is raw:
            continue
        floor = by_name.get(floor_of.get(c.name, ""))
        to_floor = ratio(c, floor, 50).text(".2f") if floor is not None else "-"
        p50 = ratio(c, raw, 50)
        print(
            f"{c.name:<17}{p50.text('.2f'):<26}{ratio(c, raw, 99).text('.2f'):<26}"
            f"{to_floor:<26}{floor.name if floor is not None else ''}"
        )
        summary.append(f"{c.name} x{p50.median:.2f}")
    if unstable:
        print(f"UNSTABLE (repeats differ by > 30% in p50 or p99): {', '.join(unstable)}")
    summary.append(f"unstable: {', '.join(unstable) or 'none'}")
    return summary
