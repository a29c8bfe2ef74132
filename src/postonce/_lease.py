"""Lease owners: who holds an intent's lease, and whether that process is provably gone.

A lease names its owner as ``host/boot/pidns/pid/start/nonce``: the host name
(``POSTONCE_HOST`` where set),
the kernel's boot id, the PID namespace, the process id and its start time (in
clock ticks since boot), and a nonce per client. A claimant on the same host,
in the same boot and PID namespace, can then tell at once that the owner
process is gone (no such pid, or the pid now belongs to a later process) and
take its intents over without waiting for the lease to expire. Anything it
cannot tell (another host, another container, an older owner format) is
alive: only the lease's expiry frees it.
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
from dataclasses import dataclass

__all__ = ["Owner", "alive", "new_owner", "this_process"]


@dataclass(frozen=True, slots=True)
class Owner:
    """The parts of an owner string that say where and which process it is."""

    host: str  # host name and boot id: one running kernel
    pidns: str  # PID namespace: where ``pid`` means this process
    pid: int
    start: str  # the process's start time: a pid reused later has another

    @classmethod
    def parse(cls, owner: str) -> Owner | None:
        """The parts of ``owner``, or None for another format (say, a version before this)."""
        parts = owner.split("/")
        if len(parts) != 6 or not parts[3].isdigit():
            return None
        return cls(f"{parts[0]}/{parts[1]}", parts[2], int(parts[3]), parts[4])


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def _start_of(pid: int) -> str | None:
    """The start time of process ``pid`` (Linux ``/proc``); "" where unknown; None if gone.

    Only a missing process is gone: a /proc entry that cannot be read (hidepid,
    a security module) or a process of another user is alive, start unknown.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except FileNotFoundError:
        stat = None
    except OSError:
        return ""
    if stat:
        # Field 22, counted after the command name (which may hold spaces and parentheses).
        return stat.rsplit(")", 1)[-1].split()[19]
    try:
        os.kill(pid, 0)  # /proc may hide it (hidepid): ask the kernel
    except ProcessLookupError:
        return None
    except PermissionError:
        return ""  # someone else's process: alive
    return ""


@functools.lru_cache(maxsize=1)
def this_process() -> Owner:
    """This process as an Owner (computed once; a forked child calls :func:`new_owner` anew)."""
    boot = _read("/proc/sys/kernel/random/boot_id").split("-")[0] or "noboot"
    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = "nons"
    # POSTONCE_HOST names the host where host names are not unique (containers
    # that share one, say); a claimant only judges owners of its own host.
    host = (os.environ.get("POSTONCE_HOST") or socket.gethostname()).replace("/", "_") or "nohost"
    return Owner(f"{host}/{boot}", pidns, os.getpid(), _start_of(os.getpid()) or "0")


def new_owner() -> str:
    """A fresh owner string for one client of this process."""
    me = this_process()
    if me.pid != os.getpid():  # forked since: this is another process
        this_process.cache_clear()
        me = this_process()
    return f"{me.host}/{me.pidns}/{me.pid}/{me.start}/{secrets.token_hex(4)}"


def alive(owner: str) -> bool:
    """False only when ``owner``'s process is provably gone: same host, boot and PID namespace,
    and its pid is free or now names a process started at another time."""
    theirs = Owner.parse(owner)
    me = this_process()
    if me.pid != os.getpid():  # forked since the cache was filled
        this_process.cache_clear()
        me = this_process()
    if theirs is None or (theirs.host, theirs.pidns) != (me.host, me.pidns):
        return True
    if theirs.pid == me.pid:
        return theirs.start == me.start or me.start == "0"
    start = _start_of(theirs.pid)
    if start is None:
        return False
    return start in ("", theirs.start)
