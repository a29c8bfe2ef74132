"""What one attempt tells about delivery: exception or answer -> Outcome. Pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from ._http import LIBRARIES
from ._intent import Outcome
from .providers import Provider, StatusRule

__all__ = ["classify_exception", "classify_response", "error_codes", "is_replay"]

# The server cannot have seen a request that never got a connection. Named, not
# imported: httpx and httpx2 raise classes of the same names from two packages.
_NOT_SENT = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"})
_CODE_KEYS = frozenset(
    {"code", "type", "reason", "errorCode", "error_code", "errorType", "__type", "Code"}
)
_SCAN_LIMIT = 65536


def classify_exception(exc: BaseException) -> Outcome:
    """An exception from sending: NOT_SENT only when the server cannot have seen it.

    Everything else, including exceptions postonce does not know, is
    AMBIGUOUS: the request may have been written, so it may have been applied.
    """
    for cls in type(exc).__mro__:
        if cls.__name__ in _NOT_SENT and cls.__module__.partition(".")[0] in LIBRARIES:
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


def _matches(rule: StatusRule, status: int, codes: frozenset[str] | str) -> bool:
    if rule.status is not None and rule.status != status:
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
    status: int, headers: Mapping[str, str], body: bytes, provider: Provider
) -> Outcome:
    """An answer from the server, read through the provider's profile.

    Order matters: a key-reuse answer is never retried, even where the retry
    hint says otherwise; an in-flight answer always waits on the same key.
    """
    if status < 400:  # the common case: no rule or hint applies below 400
        return Outcome.RETRYABLE if status in provider.retryable_statuses else Outcome.FINAL
    needs_body = any(r.code is not None for r in (*provider.mismatch, *provider.in_flight))
    codes: frozenset[str] | str = error_codes(body) if needs_body and status >= 400 else ""
    if any(_matches(rule, status, codes) for rule in provider.mismatch) and status >= 400:
        return Outcome.MISMATCH
    if any(_matches(rule, status, codes) for rule in provider.in_flight) and status >= 400:
        return Outcome.IN_PROGRESS
    if provider.retry_hint_header is not None and status >= 400:
        hint = _truthy(headers.get(provider.retry_hint_header))
        if hint is not None:
            return Outcome.RETRYABLE if hint else Outcome.FINAL
    if status in provider.retryable_statuses:
        return Outcome.RETRYABLE
    return Outcome.FINAL


def is_replay(headers: Mapping[str, str], provider: Provider) -> bool:
    """Whether the server marked this answer as a replay of an earlier one."""
    return any(_truthy(headers.get(name)) for name in provider.replay_headers)
