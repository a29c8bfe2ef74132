"""What one ``Client.post_once`` costs: against raw httpx, the durable floor and stripe-python.

Run from the repository root::

    .venv/bin/python benchmarks/bench_sync.py            # 3 repeats x 300 rounds, ~1-2 min

All arms are timed against the same loopback server in ONE run, interleaved:
each round makes ``--block`` calls in a row of every arm, in an order shuffled
by a seeded RNG, so drift (CPU frequency, page cache, a neighbour's load) hits
all of them alike. ``--repeats`` repeats of ``--rounds`` rounds are measured.

1. ``raw httpx``: ``httpx.Client.post(url, json=body, headers={"Idempotency-Key": uuid4})``.
2. ``floor NORMAL`` / ``floor FULL``: ``benchmarks/floor.py``, the least Python
   doing postonce's durable work: the write-ahead commit of the intent with its
   key (``synchronous`` NORMAL or FULL), the raw httpx POST, the answer's
   NORMAL commit before returning.
   ``schema NORMAL`` / ``schema FULL``: ``floor.SchemaFloor``, the same least
   Python running postonce's own statements on postonce's own schema. It splits
   ``postonce / floor`` in two: ``schema / floor`` is what postonce's schema and
   SQL cost, ``postonce / schema`` what its Python costs on top.
3. ``postonce NORMAL`` / ``postonce FULL``:
   ``postonce.Client(durability=...).post_once(url, json=body,
   intent=postonce.ONE_OFF)``, a new intent per call.
4. ``FULL commit``: ``BEGIN IMMEDIATE; INSERT`` a ~200-byte row ``; COMMIT``
   into a separate WAL-mode SQLite file with ``synchronous=FULL``, in the same
   directory as the outboxes: what one fsync'd commit costs on this disk.
5. ``stripe-python`` (if installed; the bench extra has it):
   ``stripe.StripeClient(...).v1.payment_intents.create`` on its
   ``HTTPXClient`` with ``max_network_retries=2``, its own in-memory retry loop.

Per-call latencies are kept, not only medians: the table gives min, p50, p99
and max per arm, pooled over the repeats, with ratios to raw and to the floor
of the same durability, and the p50 and p99 of each repeat as min/median/max
(``UNSTABLE`` when the repeats differ by more than 30%). Work a call leaves
behind is counted (see ``run_rounds``), and SQLite's automatic checkpoints run
inside the commit that triggers them, so the checkpoint tail is in p99 and max.
The target lines compute each ratio within a repeat, then show its spread.

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
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx

import postonce

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floor import Floor, SchemaFloor, Synchronous
from spread import Spread, percentile, verdict

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
    # The samples of each finished repeat (``end_repeat`` moves ``samples`` here).
    repeats: list[list[int]] = field(default_factory=list)

    def end_repeat(self) -> None:
        self.repeats.append(self.samples)
        self.samples = []

    def all_samples(self) -> list[int]:
        return [s for repeat in self.repeats for s in repeat] + self.samples


def _check(response: httpx.Response, who: str) -> None:
    if response.status_code != 201:
        raise RuntimeError(f"{who}: expected 201 from the loopback server, got {response}")


def raw_candidate(http: httpx.Client, url: str) -> Candidate:
    def call() -> None:
        response = http.post(url, json=BODY, headers={"Idempotency-Key": str(uuid.uuid4())})
        _check(response, "raw")

    return Candidate("raw httpx", call)


def floor_candidate(floor: Floor | SchemaFloor, url: str, kind: str = "floor") -> Candidate:
    label = f"{kind} {floor.synchronous}"

    def call() -> None:
        _check(floor.post_once(url, BODY), label)

    return Candidate(label, call)


def postonce_candidate(client: postonce.Client, url: str, label: str) -> Candidate:
    def call() -> None:
        _check(client.post_once(url, json=BODY, intent=postonce.ONE_OFF), label)

    def settle() -> None:
        client.outbox  # noqa: B018 - reading the property commits the write-behind queue

    return Candidate(label, call, settle=settle)


def stripe_candidate(client: Any) -> Candidate:
    """stripe-python's own retry loop (``StripeClient(...).v1.payment_intents.create``)."""
    params = BODY  # amount, currency, customer, description: form-encoded by stripe-python

    def call() -> None:
        created = client.v1.payment_intents.create(params=params)
        if not created.id:
            raise RuntimeError(f"stripe-python: unexpected answer {created!r}")

    return Candidate("stripe-python", call)


def open_stripe(base: str, closing: ExitStack) -> Any | None:
    """A ``stripe.StripeClient`` on its ``HTTPXClient`` aimed at ``base``; None if not installed.

    ``max_network_retries=2``: stripe-python mints the ``Idempotency-Key`` itself
    and runs its own retry loop, the one users have today.
    """
    try:
        # Optional: the bench extra has it, CI's test environment does not.
        import stripe
    except ImportError:
        return None
    # httpx warns on every str ``data=`` (what stripe-python's HTTPXClient passes).
    warnings.filterwarnings("ignore", message="Use 'content=", category=DeprecationWarning)
    http = stripe.HTTPXClient(allow_sync_methods=True)
    closing.callback(http.close)
    return stripe.StripeClient(
        "sk_test_postonce_bench",
        base_addresses={"api": base},
        http_client=http,
        max_network_retries=2,
    )


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
    SQLite's automatic checkpoints run inside the commit that crosses the
    threshold, so they land in that call's sample: the tail is measured.
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


class Repeating(Protocol):
    def end_repeat(self) -> None: ...


CandidateT = TypeVar("CandidateT", bound=Repeating)


def measure(
    run_rounds: Callable[[Sequence[CandidateT], int, random.Random, bool, int], None],
    candidates: Sequence[CandidateT],
    args: argparse.Namespace,
) -> None:
    """Warm-up rounds, then ``args.repeats`` measured repeats of ``args.rounds`` rounds.

    ``run_rounds(candidates, rounds, rng, keep, block)`` makes the rounds in an
    order drawn from ``args.seed``; after each measured repeat every candidate's
    ``end_repeat`` files its samples, and progress is printed.
    """
    rng = random.Random(args.seed)
    run_rounds(candidates, args.warmup, rng, False, args.block)
    gc.collect()
    started = time.monotonic()
    for number in range(1, args.repeats + 1):
        run_rounds(candidates, args.rounds, rng, True, args.block)
        for candidate in candidates:
            candidate.end_repeat()
        print(f"repeat {number}/{args.repeats} done at {time.monotonic() - started:.1f} s")
        sys.stdout.flush()


@dataclass(frozen=True)
class Stats:
    n: int
    min_us: float
    p50_us: float
    p99_us: float
    max_us: float


def stats_of(samples: Sequence[int]) -> Stats:
    us = [s / 1000 for s in samples]
    return Stats(len(us), min(us), percentile(us, 50), percentile(us, 99), max(us))


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
    parser.add_argument(
        "--rounds", type=int, default=300, help="measured rounds per repeat (default 300)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats (default 3)")
    parser.add_argument("--warmup", type=int, default=50, help="uncounted rounds (default 50)")
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
    parser.add_argument(
        "--no-stripe", action="store_true", help="leave stripe-python out even if installed"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.repeats < 1 or args.block < 1:
        parser.error("--rounds, --repeats and --block must be >= 1, --warmup >= 0")
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


# Which floor each arm is held against: the one with its durability; arms that
# write nothing down are held against the cheaper (NORMAL) floor.
FLOOR_OF = {
    "postonce NORMAL": "floor NORMAL",
    "postonce FULL": "floor FULL",
    "floor FULL": "floor NORMAL",
    "schema NORMAL": "floor NORMAL",
    "schema FULL": "floor FULL",
}
LEVELS: tuple[Synchronous, ...] = ("NORMAL", "FULL")
FLOOR_TARGET = 1.10  # issue 18: post_once within 1.10x of the floor
TAIL_TARGET = 2.0  # issue 18: p99(postonce NORMAL) <= 2x p99(raw)


def _per_repeat(candidate: Candidate, pick: Callable[[Stats], float]) -> Spread:
    return Spread.of(pick(stats_of(samples)) for samples in candidate.repeats)


def _ratio_spread(top: Candidate, bottom: Candidate, pick: Callable[[Stats], float]) -> Spread:
    """``top / bottom`` of one figure, computed within each repeat."""
    return Spread.of(
        pick(stats_of(a)) / pick(stats_of(b))
        for a, b in zip(top.repeats, bottom.repeats, strict=True)
    )


def _p50(s: Stats) -> float:
    return s.p50_us


def _p99(s: Stats) -> float:
    return s.p99_us


def report(candidates: Sequence[Candidate]) -> None:
    by_name = {c.name: c for c in candidates}
    table = {c.name: stats_of(c.all_samples()) for c in candidates}
    raw = table["raw httpx"]
    print()
    print("per-call latency, all repeats pooled (us); p50 and p99 per repeat as min/median/max")
    print(
        f"{'arm':<16}{'n':>6}{'min':>8}{'p50':>8}{'p99':>8}{'max':>9}"
        f"   {'p50 per repeat':<24}{'p99 per repeat':<24}"
    )
    for name, s in table.items():
        candidate = by_name[name]
        print(
            f"{name:<16}{s.n:>6}{s.min_us:>8.0f}{s.p50_us:>8.0f}{s.p99_us:>8.0f}{s.max_us:>9.0f}"
            f"   {_per_repeat(candidate, _p50).text():<24}"
            f"{_per_repeat(candidate, _p99).text():<24}"
        )
    print()
    print("ratios, pooled: against raw httpx, and against the floor of the same durability")
    print(
        f"{'arm':<16}{'p50/raw':>9}{'p99/raw':>9}{'max/raw':>9}   {'floor':<13}"
        f"{'p50/floor':>10}{'p99/floor':>10}{'max/floor':>10}"
    )
    for name, s in table.items():
        floor_name = FLOOR_OF.get(name, "floor NORMAL")
        f = table[floor_name]
        print(
            f"{name:<16}{s.p50_us / raw.p50_us:>8.2f}x{s.p99_us / raw.p99_us:>8.2f}x"
            f"{s.max_us / raw.max_us:>8.2f}x   {floor_name:<13}"
            f"{s.p50_us / f.p50_us:>9.2f}x{s.p99_us / f.p99_us:>9.2f}x{s.max_us / f.max_us:>9.2f}x"
        )
    print()
    print("issue 18 targets (ratios within each repeat, min/median/max over repeats):")
    summary: list[str] = [f"raw p50={raw.p50_us:.0f}us p99={raw.p99_us:.0f}us"]
    for level in ("NORMAL", "FULL"):
        ours, floor = by_name[f"postonce {level}"], by_name[f"floor {level}"]
        p50 = _ratio_spread(ours, floor, _p50)
        p99 = _ratio_spread(ours, floor, _p99)
        print(
            f"  postonce {level} / floor {level}: p50 {p50.text('.2f')}, "
            f"p99 {p99.text('.2f')}  "
            f"(target p50 <= {FLOOR_TARGET:.2f}: {verdict(p50.median <= FLOOR_TARGET, p50)})"
        )
        floor_raw = _ratio_spread(floor, by_name["raw httpx"], _p50)
        summary.append(
            f"{level}: postonce/floor p50 x{p50.median:.2f} p99 x{p99.median:.2f}"
            f" floor/raw p50 x{floor_raw.median:.2f}"
        )
        schema = by_name[f"schema {level}"]
        schema_floor = _ratio_spread(schema, floor, _p50)
        ours_schema = _ratio_spread(ours, schema, _p50)
        print(
            f"    in two: schema {level} / floor {level} p50 {schema_floor.text('.2f')} "
            f"(postonce's statements on its schema), postonce {level} / schema {level} p50 "
            f"{ours_schema.text('.2f')} (the rest of postonce)"
        )
        summary.append(
            f"{level}: schema/floor p50 x{schema_floor.median:.2f}"
            f" postonce/schema p50 x{ours_schema.median:.2f}"
        )
    normal = by_name["postonce NORMAL"]
    tail = _ratio_spread(normal, by_name["raw httpx"], _p99)
    print(
        f"  p99 postonce NORMAL / p99 raw: {tail.text('.2f')}  "
        f"(target <= {TAIL_TARGET:.1f}: {verdict(tail.median <= TAIL_TARGET, tail)})"
    )
    summary.append(f"tail NORMAL p99/raw x{tail.median:.2f}")
    if "stripe-python" in by_name:
        ours_raw = _ratio_spread(normal, by_name["raw httpx"], _p50)
        stripe_raw = _ratio_spread(by_name["stripe-python"], by_name["raw httpx"], _p50)
        below = verdict(ours_raw.median < stripe_raw.median, ours_raw, stripe_raw)
        print(
            f"  p50/raw: postonce NORMAL {ours_raw.text('.2f')} vs stripe-python "
            f"{stripe_raw.text('.2f')}  (target below stripe-python: {below})"
        )
        summary.append(
            f"p50/raw postonce NORMAL x{ours_raw.median:.2f} stripe x{stripe_raw.median:.2f}"
        )
    unstable = [
        c.name for c in candidates if _per_repeat(c, _p50).unstable or _per_repeat(c, _p99).unstable
    ]
    if unstable:
        print(f"UNSTABLE (repeats differ by > 30% in p50 or p99): {', '.join(unstable)}")
    summary.append(f"unstable: {', '.join(unstable) or 'none'}")
    print("SUMMARY sync c=1: " + "; ".join(summary))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with pinned_server(".tmp-bench-sync-", args.dir) as pinned, ExitStack() as closing:
        workdir, server = pinned.workdir, pinned.server
        print_facts(workdir, pinned.cpus, pinned.pinning, server)
        print(
            f"rounds: {args.repeats} repeats x {args.rounds} measured + {args.warmup} warm-up, "
            f"{args.block} calls in a row per arm and round, seed {args.seed}; "
            f"load average at start: {os.getloadavg()}"
        )
        sys.stdout.flush()

        def http() -> httpx.Client:
            return closing.enter_context(httpx.Client())

        floors: list[Candidate] = []
        for kind, made in (("floor", Floor), ("schema", SchemaFloor)):
            for level in LEVELS:
                floor = made(workdir / f"{kind}-{level.lower()}.sqlite3", level, http())
                closing.callback(floor.close)
                floors.append(floor_candidate(floor, server.url, kind))
        full = closing.enter_context(
            postonce.Client(outbox=workdir / "outbox-full.sqlite3", durability="full")
        )
        normal = closing.enter_context(
            postonce.Client(outbox=workdir / "outbox-normal.sqlite3", durability="normal")
        )
        conn = sqlite3.connect(workdir / "bare-commit.sqlite3", isolation_level=None)
        closing.callback(conn.close)

        candidates = [
            raw_candidate(http(), server.url),
            *floors,
            postonce_candidate(normal, server.url, "postonce NORMAL"),
            postonce_candidate(full, server.url, "postonce FULL"),
            commit_candidate(conn),
        ]
        stripe_client = (
            None if args.no_stripe else open_stripe(server.url.rsplit("/v1/", 1)[0], closing)
        )
        if stripe_client is not None:
            import stripe

            print(f"stripe-python: {stripe.VERSION} (max_network_retries=2)")
            candidates.append(stripe_candidate(stripe_client))
        else:
            print("stripe-python: not installed or left out (--no-stripe): no stripe arm")
        measure(run_rounds, candidates, args)
        print(f"load average at end: {os.getloadavg()}")
        report(candidates)
    return 0


if __name__ == "__main__":
    run_main(main)
