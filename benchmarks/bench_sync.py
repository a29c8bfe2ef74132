"""What one ``Client.post_once`` costs on top of the raw httpx POST it wraps.

Run from the repository root::

    .venv/bin/python benchmarks/bench_sync.py --rounds 2000

Four candidates are timed against the same loopback server, interleaved: each
round makes one call of every candidate, in an order shuffled by a seeded RNG,
so drift (CPU frequency, page cache, the server's state) hits all of them alike.

1. ``raw``: ``httpx.Client.post(url, json=body, headers={"Idempotency-Key": uuid4})``.
2. ``postonce FULL``: ``postonce.Client(durability="full").post_once(url, json=body)``,
   a new intent per call. By design one call is one ``synchronous=FULL``
   write-ahead commit, the POST, and one ``synchronous=NORMAL`` commit of the
   2xx answer.
3. ``postonce NORMAL``: the same with ``durability="normal"`` (both commits NORMAL).
4. ``FULL commit``: ``BEGIN IMMEDIATE; INSERT`` a ~200-byte row ``; COMMIT``
   into a separate WAL-mode SQLite file with ``synchronous=FULL``, in the same
   directory as the outboxes: one measured FULL commit on the same disk.

Every HTTP candidate has its own ``httpx.Client`` and so its own keep-alive
connection. The garbage collector stays on: what postonce allocates is part
of what it costs.

The server is a raw asyncio HTTP/1.1 keep-alive server (an ``asyncio.Protocol``
that answers every POST with ``201`` and a small JSON body), not uvicorn: with
the pure-Python h11 parser that is what is installed, uvicorn added roughly
300 us per request on the reference machine, all of it noise to what is
measured here. It runs in a separate process pinned to the second available
CPU; this process pins itself to the first (with one CPU, nothing is pinned).
It is terminated at the end, on Ctrl-C, on an error, and exits by itself if
this process dies.

The outboxes live in a fresh directory under ``benchmarks/`` (``--dir`` picks
another parent), which is deleted at the end. A FULL commit on tmpfs is free,
so the filesystem type is printed and a warning is given for a RAM filesystem.

Nothing is asserted about the timings: the script only prints.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
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
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
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

_RESPONSE_BODY = b'{"id":"ch_0000000000000001","status":"created"}'
_RESPONSE_201 = (
    b"HTTP/1.1 201 Created\r\n"
    b"content-type: application/json\r\n"
    b"content-length: " + str(len(_RESPONSE_BODY)).encode() + b"\r\n"
    b"\r\n" + _RESPONSE_BODY
)
_RESPONSE_405 = b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n"
_RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
_SERVER_START_TIMEOUT = 15.0


# -- the loopback server (runs in the child process) ---------------------------


class _HTTPProtocol(asyncio.Protocol):
    """Just enough HTTP/1.1: keep-alive, Content-Length bodies, pipelining."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : stop if stop >= 0 else None])
            total = end + 4 + length
            if len(buffer) < total:
                return
            del buffer[:total]
            assert self._transport is not None
            closing = b"\r\nconnection: close" in head
            self._transport.write(_RESPONSE_201 if head.startswith(b"post ") else _RESPONSE_405)
            if closing:
                self._transport.close()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def _serve(link: Connection) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_HTTPProtocol, "127.0.0.1", 0, backlog=16)
    port = int(server.sockets[0].getsockname()[1])
    link.send((port, os.getpid()))
    gone: asyncio.Future[None] = loop.create_future()

    def parent_gone() -> None:
        if not gone.done():
            gone.set_result(None)

    # The parent never writes: the link turns readable only at EOF, when it has died.
    loop.add_reader(link.fileno(), parent_gone)
    try:
        await gone
    finally:
        server.close()


def _server_main(link: Connection, cpu: int | None) -> None:
    """Entry point of the server process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this ends
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    gc.disable()
    asyncio.run(_serve(link))


@dataclass
class ServerProcess:
    url: str
    pid: int
    cpu: int | None
    _process: BaseProcess
    _link: Connection

    def stop(self) -> None:
        """Terminate the server process; escalate to SIGKILL if it lingers."""
        process = self._process
        self._link.close()
        if process.is_alive():
            process.terminate()
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def start_server(cpu: int | None) -> ServerProcess:
    ctx = get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=_server_main, args=(child_end, cpu), name="bench-server", daemon=True
    )
    process.start()
    child_end.close()
    try:
        if not parent_end.poll(_SERVER_START_TIMEOUT):
            raise RuntimeError("the loopback server did not start in time")
        port, pid = parent_end.recv()
    except BaseException:
        parent_end.close()
        process.terminate()
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
        raise
    return ServerProcess(
        url=f"http://127.0.0.1:{port}/v1/charges",
        pid=int(pid),
        cpu=cpu,
        _process=process,
        _link=parent_end,
    )


# -- machine facts ---------------------------------------------------------------


def filesystem_of(path: Path) -> tuple[str, str]:
    """(fstype, mount point) of the mount holding ``path``, from /proc/mounts."""
    target = str(path.resolve())
    best = ("unknown", "?")
    best_len = -1
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > best_len:
            best, best_len = (fields[2], mount), len(mount)
    return best


def available_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


# -- candidates ------------------------------------------------------------------


@dataclass
class Candidate:
    name: str
    call: Callable[[], None]
    samples: list[int] = field(default_factory=list)
    # Work a call leaves running behind it (postonce's write-behind of the 2xx
    # record): waited for at the end of each block and counted in its last sample.
    settle: Callable[[], None] | None = None


def _check(response: httpx.Response, who: str) -> None:
    if response.status_code != 201:
        raise RuntimeError(f"{who}: expected 201 from the loopback server, got {response}")


def raw_candidate(http: httpx.Client, url: str) -> Candidate:
    def call() -> None:
        response = http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())})
        _check(response, "raw")

    return Candidate("raw httpx", call)


def postonce_candidate(client: postonce.Client, url: str, label: str) -> Candidate:
    def call() -> None:
        _check(client.post_once(url, json=BODY), label)

    def settle() -> None:
        client.outbox  # noqa: B018 - reading the property commits the write-behind queue

    return Candidate(label, call, settle=settle)


def commit_candidate(conn: sqlite3.Connection) -> Candidate:
    conn.execute("PRAGMA journal_mode = WAL").fetchone()
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    payload = os.urandom(100).hex()  # 200 bytes

    def call() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO rows (payload) VALUES (?)", (payload,))
        conn.execute("COMMIT")

    return Candidate("FULL commit", call)


# -- measuring -------------------------------------------------------------------


def run_rounds(
    candidates: Sequence[Candidate], rounds: int, rng: random.Random, keep: bool, block: int = 1
) -> None:
    """``rounds`` rounds; in each, every candidate makes ``block`` calls in a row, shuffled.

    Calls in a row are how an application calls: work one call leaves behind
    (a candidate's ``settle``) overlaps that candidate's own next call, never
    another candidate's. What is still pending at the end of the block is
    waited for and added to the block's last sample, so nothing goes uncounted.
    """
    order = list(candidates)
    clock = time.perf_counter_ns
    for _ in range(rounds):
        rng.shuffle(order)
        for candidate in order:
            for i in range(block):
                started = clock()
                candidate.call()
                if i == block - 1 and candidate.settle is not None:
                    candidate.settle()
                elapsed = clock() - started
                if keep:
                    candidate.samples.append(elapsed)


@dataclass(frozen=True)
class Stats:
    n: int
    min_us: float
    median_us: float
    p90_us: float
    p99_us: float


def stats_of(samples: Sequence[int]) -> Stats:
    us = [s / 1000 for s in samples]
    if len(us) >= 2:
        cuts = statistics.quantiles(us, n=100, method="inclusive")
        p90, p99 = cuts[89], cuts[98]
    else:
        p90 = p99 = us[0]
    return Stats(len(us), min(us), statistics.median(us), p90, p99)


# -- the frame every script runs in ------------------------------------------------


@dataclass(frozen=True)
class Pinned:
    """A script's work directory and loopback server, with the CPU pinning in effect."""

    workdir: Path
    server: ServerProcess
    cpus: list[int]
    pinning: str


@contextmanager
def pinned_server(prefix: str, parent: Path | None) -> Iterator[Pinned]:
    """A fresh work directory, the server pinned to the second CPU and this process to the first.

    The server is stopped and the directory removed on the way out, however it is left.
    """
    cpus = available_cpus()
    can_pin = hasattr(os, "sched_setaffinity") and len(cpus) >= 2
    client_cpu, server_cpu = (cpus[0], cpus[1]) if can_pin else (None, None)
    parent = parent if parent is not None else Path(__file__).resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    server: ServerProcess | None = None
    try:
        server = start_server(server_cpu)
        if client_cpu is not None:
            os.sched_setaffinity(0, {client_cpu})  # children (drains) inherit it
            pinning = f"client -> CPU {client_cpu}, server -> CPU {server_cpu}"
        else:
            pinning = f"off (only {len(cpus)} CPU available)"
        yield Pinned(workdir, server, cpus, pinning)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's clean-up: server stopped, dir removed


def run_main(main: Callable[[], int]) -> None:
    """Run a script's ``main`` and exit with its code; SIGTERM and Ctrl-C clean up first."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = main()
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        code = 130
    sys.exit(code)


# -- main --------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2000, help="measured rounds (default 2000)")
    parser.add_argument("--warmup", type=int, default=200, help="uncounted rounds (default 200)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="parent directory for the outboxes (a fresh subdirectory is made and removed); "
        "default: the benchmarks/ directory",
    )
    parser.add_argument("--seed", type=int, default=12345, help="seed of the round order")
    parser.add_argument(
        "--block", type=int, default=10, help="calls in a row per candidate and round (default 10)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0:
        parser.error("--rounds must be >= 1 and --warmup >= 0")
    return args


def print_facts(workdir: Path, cpus: Sequence[int], pinning: str, server: ServerProcess) -> None:
    fstype, mount = filesystem_of(workdir)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"python: {sys.version.split()[0]} ({platform.python_implementation()})")
    print(f"platform: {platform.platform()}")
    print(f"cpus: {os.cpu_count()} (available before pinning: {list(cpus)})")
    print(f"sqlite: {sqlite3.sqlite_version}")
    print(f"postonce: {postonce.__version__}  httpx: {httpx.__version__}")
    print(f"outbox dir: {workdir} on {fstype} (mount {mount})")
    if fstype in _RAM_FILESYSTEMS:
        print("WARNING: the outbox dir is on a RAM filesystem: fsync is free, FULL means nothing")
    print(f"pinning: {pinning}")
    print(
        f"server: raw asyncio HTTP/1.1 keep-alive (asyncio.Protocol), pid {server.pid}, "
        f"{server.url}"
    )


def report(candidates: Sequence[Candidate]) -> None:
    table = {c.name: stats_of(c.samples) for c in candidates}
    print()
    print(f"{'candidate':<18}{'n':>7}{'min':>10}{'median':>10}{'p90':>10}{'p99':>10}   (us)")
    for name, s in table.items():
        print(
            f"{name:<18}{s.n:>7}{s.min_us:>10.1f}{s.median_us:>10.1f}"
            f"{s.p90_us:>10.1f}{s.p99_us:>10.1f}"
        )
    raw = table["raw httpx"].median_us
    full = table["postonce FULL"].median_us
    normal = table["postonce NORMAL"].median_us
    commit = table["FULL commit"].median_us
    full_x, normal_x = full / raw, normal / raw
    full_commits = (full - raw) / commit
    normal_commits = (normal - raw) / commit
    print()
    print(f"median(postonce FULL) / median(raw)   = x{full_x:.2f}")
    print(f"median(postonce NORMAL) / median(raw) = x{normal_x:.2f}")
    print(
        f"overhead FULL   = {full - raw:.1f} us = {full_commits:.2f} FULL commits "
        f"(1 FULL commit = {commit:.1f} us median)"
    )
    print(f"overhead NORMAL = {normal - raw:.1f} us = {normal_commits:.2f} FULL commits")
    print(
        f"SUMMARY sync c=1: raw={raw:.0f}us full={full:.0f}us (x{full_x:.2f}) "
        f"normal={normal:.0f}us (x{normal_x:.2f}) full-overhead={full_commits:.1f} commits"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with pinned_server(".tmp-bench-sync-", args.dir) as pinned, ExitStack() as closing:
        workdir, server = pinned.workdir, pinned.server
        print_facts(workdir, pinned.cpus, pinned.pinning, server)
        print(
            f"rounds: {args.rounds} measured + {args.warmup} warm-up, {args.block} calls in a row"
            f" per candidate, seed {args.seed}"
        )
        sys.stdout.flush()

        raw_http = closing.enter_context(httpx.Client())
        full = closing.enter_context(
            postonce.Client(outbox=workdir / "outbox-full.sqlite3", durability="full")
        )
        normal = closing.enter_context(
            postonce.Client(outbox=workdir / "outbox-normal.sqlite3", durability="normal")
        )
        conn = sqlite3.connect(workdir / "bare-commit.sqlite3", isolation_level=None)
        closing.callback(conn.close)

        candidates = [
            raw_candidate(raw_http, server.url),
            postonce_candidate(full, server.url, "postonce FULL"),
            postonce_candidate(normal, server.url, "postonce NORMAL"),
            commit_candidate(conn),
        ]
        rng = random.Random(args.seed)
        run_rounds(candidates, args.warmup, rng, keep=False, block=args.block)
        gc.collect()
        started = time.monotonic()
        run_rounds(candidates, args.rounds, rng, keep=True, block=args.block)
        print(f"measured in {time.monotonic() - started:.1f} s")
        report(candidates)
    return 0


if __name__ == "__main__":
    run_main(main)
