"""What one attempt tells about delivery: exception or answer -> Outcome. Pure."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping

from ._intent import Outcome
from .providers import Provider, StatusRule

__all__ = [
    "classify_exception",
    "classify_response",
    "error_codes",
    "from_connection_layer",
    "is_replay",
]

# httpcore raises these only before it writes a request: while waiting for a
# connection from the pool, connecting, or refusing the URL's scheme. Named, not
# imported: postonce does not import httpcore.
_BEFORE_WRITE = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"})
_CODE_KEYS = frozenset(
    {"code", "type", "reason", "errorCode", "error_code", "errorType", "__type", "Code"}
)
_SCAN_LIMIT = 65536


def _top(obj: object) -> str:
    return type(obj).__module__.partition(".")[0]


def from_connection_layer(exc: BaseException) -> bool:
    """Whether httpx's own transport raised ``exc`` for an httpcore failure before any write.

    The exception type alone proves nothing: httpx-aiohttp maps every aiohttp
    connection error (the server dropping the connection after executing the
    request among them) to ``httpx.ConnectTimeout``, and any transport may raise
    ``ConnectError`` for what it likes. httpx's ``HTTPTransport`` raises these
    ``from`` the httpcore exception of the same name, and httpcore raises those
    only before it writes. httpx2 and its httpcore2 are not trusted this way.
    """
    cause = exc.__cause__
    return (
        _top(exc) == "httpx"
        and type(exc).__name__ in _BEFORE_WRITE
        and cause is not None
        and _top(cause) == "httpcore"
        and type(cause).__name__ == type(exc).__name__
    )


def classify_exception(exc: BaseException, *, body_unread: bool = False) -> Outcome:
    """An exception from sending: NOT_SENT only when no request can have reached the server.

    That is provable two ways. ``body_unread``: the transport never read the
    request's (non-empty) body, so the server holds at most headers that
    promise a body it never got, which no server executes. Or httpx's own
    connection layer raised it before writing (:func:`from_connection_layer`).
    Everything else, on any transport, is AMBIGUOUS: the request may have been
    written, so it may have been applied.
    """
    if body_unread or from_connection_layer(exc):
        return Outcome.NOT_SENT
    return Outcome.AMBIGUOUS


def _walk(node: object, depth: int) -> Iterable[str]:
    if depth > 4:
        return
    if isinstance(node, dict):
        for name, value in node.items():
            if name in _CODE_KEYS and isinstance(value, str | int) and not isinstance(value, bool):
                yield str(value)
            yield from _walk(value, depth + 1)
    elif isinstance(node, list):
        for item in node[:16]:
            yield from _walk(item, depth + 1)


def error_codes(body: bytes) -> frozenset[str] | str:
    """The error codes in a JSON error body, or the head of a body that is not JSON."""
    head = body[:_SCAN_LIMIT]
    try:
        parsed = json.loads(head)
    except (ValueError, RecursionError):  # a hostile nesting depth is just text to us
        return head.decode("utf-8", "replace")
    return frozenset(_walk(parsed, 0))


def _media_type(headers: Mapping[str, str]) -> str:
    return (headers.get("content-type") or "").partition(";")[0].strip().lower()


def _matches(
    rule: StatusRule, status: int, codes: frozenset[str] | str, headers: Mapping[str, str]
) -> bool:
    if rule.status is not None and rule.status != status:
        return False
    if rule.content_type is not None and _media_type(headers) != rule.content_type.lower():
        return False
    if rule.code is None:
        return True
    return rule.code in codes


def _truthy(value: str | None) -> bool | None:
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def classify_response(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    provider: Provider,
    *,
    key_seen: bool = True,
) -> Outcome:
    """An answer from the server, read through the provider's profile.

    Order matters: a key-reuse answer is never retried, even where the retry
    hint says otherwise; an in-flight answer always waits on the same key.

    ``key_seen``: an earlier attempt with this key may have reached the server
    (it was ambiguous, or answered). Only then can the key have been used
    before, so only then is a key-reuse answer believed; to the first send of a
    fresh key the same status is an ordinary answer (a validation 422, say).
    """
    if status < 400:  # the common case: no rule or hint applies below 400
        return Outcome.RETRYABLE if status in provider.retryable_statuses else Outcome.FINAL
    needs_body = any(r.code is not None for r in (*provider.mismatch, *provider.in_flight))
    codes: frozenset[str] | str = error_codes(body) if needs_body else ""
    if key_seen and any(_matches(rule, status, codes, headers) for rule in provider.mismatch):
        return Outcome.MISMATCH
    if any(_matches(rule, status, codes, headers) for rule in provider.in_flight):
        return Outcome.IN_PROGRESS
    if provider.retry_hint_header is not None:
        hint = _truthy(headers.get(provider.retry_hint_header))
        if hint is not None:
            return Outcome.RETRYABLE if hint else Outcome.FINAL
    if status in provider.retryable_statuses:
        return Outcome.RETRYABLE
    if status >= 500:
        return _server_error(headers, provider)
    return Outcome.FINAL


def _server_error(headers: Mapping[str, str], provider: Provider) -> Outcome:
    """A 5xx no rule, hint or retryable status settled, read by the provider's 5xx rule."""
    rule = provider.server_errors
    if rule == "hint":  # the hint was absent: the provider says not to retry
        return Outcome.FINAL
    if rule == "replayed" and is_replay(headers, provider):
        return Outcome.FINAL  # the answer stored for this key: no retry can change it
    return Outcome.RETRYABLE


def is_replay(headers: Mapping[str, str], provider: Provider) -> bool:
    """Whether the server marked this answer as a replay of an earlier one.

    Read in one pass over an httpx ``Headers``' raw list (every answer is
    checked; a lookup per name would scan the list once per name), with the
    values of a repeated header joined as ``Headers.get`` joins them.
    """
    names = provider.replay_headers
    if not names:
        return False
    raw = getattr(headers, "raw", None)
    if raw is None:
        return any(_truthy(headers.get(name)) for name in names)
    wanted = _lowered(tuple(names))  # a tuple: hashable, whatever the profile holds
    found: dict[bytes, list[str]] = {}
    for name, value in raw:
        lowered = name.lower()
        if lowered in wanted:
            found.setdefault(lowered, []).append(value.decode("latin-1"))
    return any(_truthy(", ".join(found[name])) for name in wanted if name in found)


@functools.lru_cache(maxsize=64)
def _lowered(names: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(name.lower().encode("latin-1") for name in names)
