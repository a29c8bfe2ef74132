"""A process for the lease tests, to be SIGKILLed: ``python -m tests.lease_worker MODE ...``.

Modes (all against the loopback test server, with the library's default lease
settings unless ``--lease``/``--heartbeat`` say otherwise):

* ``send OUTBOX BASE_URL PATH REF DELAY``: post_once one intent whose execution
  takes DELAY seconds at the server (the test kills it mid-request);
* ``answer-then-die OUTBOX BASE_URL PATH REF``: post_once one intent, print
  ``answered STATUS`` and SIGKILL itself at once, before anything else runs;
* ``drain OUTBOX BASE_URL``: drain forever (a host's drain worker).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import postonce
from tests.http_library import default_transport


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("outbox")
    parser.add_argument("base_url")
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--lease", type=float, default=None)
    parser.add_argument("--heartbeat", type=float, default=None)
    args = parser.parse_args(argv)
    options: dict[str, object] = {"outbox": args.outbox, "name": "lease-tests"}
    if args.lease is not None:
        options["lease_seconds"] = args.lease
    if args.heartbeat is not None:
        options["heartbeat"] = args.heartbeat
    transport = default_transport()
    if transport is not None:
        options["transport"] = transport
    with postonce.Client(args.base_url, **options) as client:  # type: ignore[arg-type]
        if args.mode == "drain":
            print("ready", flush=True)
            client.drain(forever=True, interval=0.05)
            return 0
        path, reference, *more = args.rest
        delay = float(more[0]) if more else 0.0
        response = client.post_once(
            path, json={"amount": 1, "_test": {"delay": delay}}, intent=reference
        )
        if args.mode == "answer-then-die":
            print(f"answered {response.status_code}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        print(f"done {response.status_code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
