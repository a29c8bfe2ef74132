"""What differs between a stored request and a new one under the same intent. Pure.

An ``IntentConflict`` names where the two requests part: the method, the path,
query parameter names, JSON field paths (``items[0].qty``) or form field names,
each changed, added (only in this call) or removed (only in the stored one).
It never shows a value: bodies and queries may hold secrets, and the outbox is
read by operators. Computed only once fingerprints differ, so a call that
resumes its own intent pays nothing for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit

from ._intent import IntentRecord, NewIntent, State
from .providers import same_provider

__all__ = [
    "MOST_NAMED",
    "Request",
    "conflict_with",
    "differences",
    "done_advice",
    "json_paths",
    "request_conflict",
]

#: The most field or parameter names one message lists; the rest are counted.
MOST_NAMED = 10

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


class Request(NamedTuple):
    """The parts of a request a fingerprint covers, as stored (or about to be)."""

    method: str
    url: str
    headers: Sequence[tuple[str, str]]
    body: bytes
    key: str  # its idempotency key: a body-borne key differs by design, and is skipped


def _media_type(headers: Sequence[tuple[str, str]]) -> str:
    for name, value in headers:
        if name.lower() == "content-type":
            return value.split(";", 1)[0].strip().lower()
    return ""


def _kind(media_type: str) -> str:
    if media_type == "application/json" or media_type.endswith("+json"):
        return "json"
    if media_type == "application/x-www-form-urlencoded":
        return "form"
    return "raw"


def _same(a: object, b: object) -> bool:
    """Equal as canonical JSON is: ``1`` is not ``1.0``, ``true`` is not ``1``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _step(path: str, name: object) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    text = str(name)
    if _PLAIN_NAME.fullmatch(text):
        return f"{path}.{text}" if path else text
    # A key that is not a field name is data (an email, an id): never printed.
    return f"{path}[<key>]"


def json_paths(stored: object, new: object, path: str = "") -> Iterator[tuple[str, str]]:
    """``(field path, "changed" | "added" | "removed")`` for each JSON value that differs.

    Objects are compared key by key and arrays index by index, down to the
    first value that differs in kind or content; ``""`` is the whole body.
    """
    if isinstance(stored, dict) and isinstance(new, dict):
        for name in sorted({*stored, *new}, key=str):
            if name not in new:
                yield _step(path, name), "removed"
            elif name not in stored:
                yield _step(path, name), "added"
            else:
                yield from json_paths(stored[name], new[name], _step(path, name))
    elif isinstance(stored, list) and isinstance(new, list):
        for index in range(max(len(stored), len(new))):
            if index >= len(new):
                yield _step(path, index), "removed"
            elif index >= len(stored):
                yield _step(path, index), "added"
            else:
                yield from json_paths(stored[index], new[index], _step(path, index))
    elif not _same(stored, new):
        yield path, "changed"


def _named(what: str, found: Sequence[tuple[str, str]]) -> str:
    """``what`` followed by its differing names, grouped by change, at most MOST_NAMED."""
    shown = found[:MOST_NAMED]
    groups = []
    for change in ("changed", "added", "removed"):
        names = [name for name, how in shown if how == change]
        if names:
            groups.append(f"{', '.join(names)} {change}")
    more = f"; and {len(found) - MOST_NAMED} more" if len(found) > MOST_NAMED else ""
    return f"{what}: {'; '.join(groups)}{more}"


def _pairs(stored: str, new: str) -> list[tuple[str, str]]:
    """The names of ``name=value`` pairs (a query, a form) whose values differ."""
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    for text, into in ((stored, before), (new, after)):
        for name, value in parse_qsl(text, keep_blank_values=True):
            into.setdefault(name, []).append(value)
    found = []
    for name in sorted({*before, *after}):
        if name not in after:
            found.append((name, "removed"))
        elif name not in before:
            found.append((name, "added"))
        elif before[name] != after[name]:
            found.append((name, "changed"))
    return found


def _without_key(stored: object, new: object, stored_key: str, new_key: str) -> None:
    """Drop a body-borne key (Adyen's ``reference``...): a new call mints a new one.

    Found as the top-level field holding each request's own key, so no profile
    is needed to know its name.
    """
    if not (isinstance(stored, dict) and isinstance(new, dict)):
        return
    for name in [n for n in stored if n in new]:
        if stored[name] == stored_key and new[name] == new_key:
            del stored[name], new[name]


def _body(stored: Request, new: Request) -> list[str]:
    was, now = _media_type(stored.headers), _media_type(new.headers)
    if _kind(was) != _kind(now):
        return [f"the body's type ({now or 'none'} here, {was or 'none'} stored)"]
    if stored.body == new.body:
        return []
    if _kind(now) == "form":
        found = _pairs(stored.body.decode("latin-1"), new.body.decode("latin-1"))
        return [_named("form fields", found)] if found else []
    if _kind(now) == "json":
        try:
            before, after = json.loads(stored.body), json.loads(new.body)
        except ValueError:
            return ["the body (not JSON as its type says; compared as bytes)"]
        _without_key(before, after, stored.key, new.key)
        found = list(json_paths(before, after))
        if found == [("", "changed")]:
            return ["the JSON body as a whole (its top-level value)"]
        return [_named("JSON fields", found)] if found else []
    return ["the body (compared as bytes)"]


def differences(stored: Request, new: Request) -> list[str]:
    """Where ``new`` parts from ``stored``, one phrase a part, no values; [] if nowhere.

    The method is shown (one of a few words); a path, query values and body
    values never are.
    """
    found = []
    if stored.method.upper() != new.method.upper():
        found.append(f"the method ({new.method.upper()} here, {stored.method.upper()} stored)")
    before, after = urlsplit(stored.url), urlsplit(new.url)
    if before.path != after.path:
        found.append("the path")
    query = _pairs(before.query, after.query)
    if query:
        found.append(_named("query parameters", query))
    found.extend(_body(stored, new))
    return found


def request_conflict(stored: Request, new: Request) -> str:
    """Why an intent's stored request is not this one, naming the parts that differ."""
    found = differences(stored, new)
    if found:
        return f"it is stored with a different request; this call differs in {'; '.join(found)}"
    headers = header_names(stored.headers, new.headers)
    if headers:
        # Only a profile's scope headers (Stripe-Account) count, but they are the
        # likely part here: the rest of the request compares equal.
        return (
            f"it is stored with a different request; this call differs in "
            f"{_named('headers', headers)} (a header that chooses the account a key acts "
            "for, such as Stripe-Account, is part of the request)"
        )
    return (
        "it is stored with a different request (method, path, query or body), though they "
        "compare equal here: this call's own credentials (an API key in its headers or "
        "query) name another account, or the fingerprint was made otherwise (another "
        "fingerprint_fields=, or another postonce version)"
    )


def header_names(
    stored: Sequence[tuple[str, str]], new: Sequence[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The names of stored headers whose values differ (content type aside: the body's part)."""
    before: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    for pairs, into in ((stored, before), (new, after)):
        for name, value in pairs:
            if name.lower() != "content-type":
                into.setdefault(name.lower(), []).append(value)
    found = []
    for name in sorted({*before, *after}):
        how = "removed" if name not in after else "added" if name not in before else "changed"
        if before.get(name) != after.get(name):
            found.append((name.title(), how))  # httpx keeps names in lower case
    return found


#: What to do about a conflict with an intent that ended without its effect.
DONE_ADVICE = (
    "It ended {state}{status}, so it is done and its name is used up: send the corrected "
    "request under a new intent= name (e.g. with a suffix such as '/2')"
)


def done_advice(state: str, status: int | None) -> str:
    """How to go on past an intent that ended failed or cancelled (its name is used up)."""
    return DONE_ADVICE.format(state=state, status=f" (HTTP {status})" if status else "")


def conflict_with(record: IntentRecord, new: NewIntent) -> str | None:
    """Why the stored intent is not the request ``new`` describes, or None if it is.

    Another sender's intent is never handed over, finished or not: its answer
    belongs to that sender, and sending it would use this client's credentials.
    """
    if record.sender is not None and new.sender is not None and record.sender != new.sender:
        return (
            f"it belongs to sender {record.sender!r}, not to this client ({new.sender!r}). "
            "If another application writes to this outbox (by default one SQLite file per OS "
            "user), give each application an outbox of its own: outbox= or the "
            "POSTONCE_OUTBOX variable (or put the application in its intent names; see 'Two "
            "applications on one host' in the senders guide). If it is this application under "
            "new credentials, take "
            f"its intents over with client.adopt({record.sender!r}), and give the client a "
            "fixed name= so that the next rotation keeps its identity"
        )
    if record.origin is not None and new.origin is not None and record.origin != new.origin:
        return f"it is addressed to {record.origin}, not to {new.origin}"
    if not same_provider(record.provider, new.provider):
        # Its key travels where that provider looks, and its horizon is that
        # provider's retention: under another, it may reach a server that never
        # saw the key (a second effect), or be retried past what the first keeps.
        return (
            f"it is stored under provider {record.provider!r}, and this call uses "
            f"{new.provider!r} (the key would travel or be kept differently)"
        )
    if record.fingerprint != new.fingerprint:
        if record.purged_at is not None:
            return (
                f"it finished as {record.state.value} and was purged: only its tombstone is "
                "left, and it was made for another request (the two cannot be compared now). "
                + done_advice(record.state.value, None)
            )
        # Only here, on a conflict, are the two requests compared part by part.
        why = request_conflict(
            Request(record.method, record.url, record.headers, record.body, record.key),
            Request(new.method, new.url, new.headers, new.body, new.key),
        )
        if record.state in (State.FAILED, State.CANCELLED):
            status = record.response.status if record.response is not None else None
            why += ". " + done_advice(record.state.value, status)
        else:
            why += (
                ". If another application on this host uses the same intent names, give each "
                "application an outbox of its own (outbox= or POSTONCE_OUTBOX)"
            )
        return why
    if new.key_given and record.key != new.key:
        return "it is stored with a different key"
    return None
