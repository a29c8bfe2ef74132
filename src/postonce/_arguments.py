"""Checks of what a caller passes to the clients' public methods, worded as they wrote it.

Pure functions shared by ``Client`` and ``AsyncClient``: a misspelt per-call
option names the public method and the option meant; ``wait()``'s arguments are
refused before the outbox is asked anything.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from ._exceptions import InvalidRequest
from ._keys import unstorable

__all__ = ["ALIASES", "check_wait", "option_names", "refuse_unknown"]

#: Words other libraries use for a per-call option, and what postonce calls it.
#: ``difflib`` finds typos (``intnet``); these are the words it cannot find.
ALIASES: Mapping[str, str] = {
    "metadata": "meta=",  # Stripe's (and most SDKs') word for the caller's data
    "idempotency_key": "key=",  # stripe-python's and the IETF draft's word
    "idempotencykey": "key=",
    "reference": "intent=",  # postonce's older word
    "name": "intent= (name= is a Client() setting: the sender's name)",
    "body": "json= (a JSON body), content= (raw bytes) or data= (a form)",
    "payload": "json= (a JSON body), content= (raw bytes) or data= (a form)",
    "query": "params=",
    "query_params": "params=",
    "retries": "retry=postonce.RetryPolicy(attempts=...)",
    "max_retries": "retry=postonce.RetryPolicy(attempts=...)",
    "retry_policy": "retry=",
    "fingerprint": "fingerprint_fields=",
    "method": "request_once(method, url, ...)",
    # httpx's per-request options that live on the client here: they are sent
    # again by a drain, which has only the client's.
    "auth": "auth= on the client (credentials are the client's, and never stored)",
    "cookies": "cookies= on the client",
    "follow_redirects": "follow_redirects= on the client",
    "files": "content= with the encoded multipart body (a file stream cannot be sent again)",
}


@functools.lru_cache(maxsize=8)
def option_names(plan: Callable[..., Any]) -> tuple[str, ...]:
    """The keyword-only options ``plan`` (a client's ``_plan``) takes, in its order."""
    return tuple(
        name
        for name, parameter in inspect.signature(plan).parameters.items()
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY
    )


def _suggestion(name: str, valid: tuple[str, ...]) -> str | None:
    lowered = name.lower()
    if lowered in valid:
        return f"{lowered}="
    if lowered in ALIASES:
        return ALIASES[lowered]
    close = difflib.get_close_matches(lowered, valid, n=1, cutoff=0.6)
    return f"{close[0]}=" if close else None


def refuse_unknown(client: object, called: str, options: Mapping[str, object]) -> None:
    """Raise TypeError naming ``Client.post_once()`` and the option meant, if one is unknown.

    Called once ``_plan`` has raised TypeError, so a call with good options pays
    nothing for it; when every option is known, it returns and the caller
    re-raises that TypeError as it was.
    """
    valid = option_names(type(client)._plan)  # type: ignore[attr-defined]  # a BaseClient's
    unknown = [name for name in options if name not in valid]
    if not unknown:
        return
    owner = f"{type(client).__name__}.{called}()"
    parts = []
    for name in unknown:
        hint = _suggestion(name, valid)
        parts.append(f"{name!r}" + (f" (did you mean {hint}?)" if hint else ""))
    noun = "argument" if len(unknown) == 1 else "arguments"
    raise TypeError(
        f"{owner} got an unexpected keyword {noun} {', '.join(parts)}; its options are "
        f"{', '.join(valid)}"
    ) from None


def check_wait(intent: str, timeout: object) -> float:
    """``wait()``'s timeout as seconds, after refusing what cannot be waited for.

    A NaN timeout would never compare as passed (the wait would spin forever),
    an infinite one never ends, and a negative one is a mistake: each is
    InvalidRequest, as is a name no outbox can hold (see ``unstorable``).
    """
    bad = unstorable(intent) if isinstance(intent, str) else None
    if bad is not None:
        raise InvalidRequest(
            f"wait() was given an intent name holding {bad[0]} at index {bad[1]}, which no "
            "outbox can store, so no intent has it"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidRequest(
            f"wait(timeout=) takes seconds as a number, not {type(timeout).__name__}",
            intent=intent,
        )
    if not math.isfinite(timeout) or timeout < 0:
        raise InvalidRequest(
            f"wait(timeout={timeout!r}) must be a finite number of seconds, 0 or more",
            intent=intent,
        )
    return float(timeout)
