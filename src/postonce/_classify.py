"""What one attempt tells about delivery: exception or answer -> Outcome. Pure."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping

from ._intent import Outcome
from .providers import Provider, StatusRule

__all__ = [
    "AUTH_REFUSED",
    "classify_exception",
    "classify_response",
    "error_codes",
    "from_connection_layer",
    "is_replay",
    "link_rels",
]

# httpcore raises these only before it writes a request: while waiting for a
# connection from the pool, connecting, or refusing the URL's scheme. Named, not
# imported: postonce does not import httpcore.
_BEFORE_WRITE = frozenset({"ConnectError", "ConnectTimeout", "PoolTimeout", "UnsupportedProtocol"})
_CODE_KEYS = frozenset(
    {"code", "type", "reason", "errorCode", "error_code", "errorType", "__type", "Code"}
)
_SCAN_LIMIT = 65536
#: The statuses that refuse a request's credentials (RFC 9110 §15.5.2, §15.5.4):
#: a provider checks them before its idempotency layer reads the key.
AUTH_REFUSED = frozenset({401, 403})
# One link-value of a Link header (RFC 8288): <target> then its parameters, up to the
# next link-value; and a rel parameter, quoted or not, in those parameters.
_LINK_VALUE = re.compile(r"<[^>]*>([^<]*)")
_REL = re.compile(r';\s*rel\s*=\s*(?:"([^"]*)"|([^\s;,"]+))', re.IGNORECASE)


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
                if name == "__type" and isinstance(value, str) and "#" in value:
                    # AWS JSON protocols qualify the code with its namespace:
                    # "com.amazon.coral.availability#ThrottlingException".
                    yield value.rpartition("#")[2]
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


def link_rels(headers: Mapping[str, str]) -> frozenset[str]:
    """The relation types of the answer's ``Link`` header(s), lower-cased.

    ``Link: <https://example.com/idempotency>; rel="describedby"; type="text/html"``
    gives ``{"describedby"}``; a ``rel`` naming several types gives each.
    """
    value = headers.get("link")
    if not value:
        return frozenset()
    rels: set[str] = set()
    for params in _LINK_VALUE.findall(value):
        for quoted, bare in _REL.findall(params):
            rels.update((quoted or bare).lower().split())
    return frozenset(rels)


def _in_text(code: str, text: str) -> bool:
    """Whether ``code`` is a whole word of ``text`` (``<Code>Throttling</Code>``), not a part."""
    start = text.find(code)
    while start >= 0:
        end = start + len(code)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not (before.isalnum() or before == "_") and not (after.isalnum() or after == "_"):
            return True
        start = text.find(code, start + 1)
    return False


def _matches(
    rule: StatusRule, status: int, codes: frozenset[str] | str, headers: Mapping[str, str]
) -> bool:
    if rule.status is not None and rule.status != status:
        return False
    if rule.content_type is not None and _media_type(headers) != rule.content_type.lower():
        return False
    if rule.link_rel is not None and rule.link_rel.lower() not in link_rels(headers):
        return False
    if rule.code is None:
        return True
    if isinstance(codes, str):
        return _in_text(rule.code, codes)
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

    Order matters (the full table is in :class:`~postonce.providers.Provider`):

    1. A key-reuse answer (``mismatch``) is MISMATCH, never retried, whatever
       the retry hint says. A refusal of the credentials (401, 403) when
       ``key_seen`` is RETRYABLE: the request was refused before any
       idempotency layer read it, so it tells nothing of an earlier attempt
       that may have been executed (a per-call key a drain lacked, a key
       rotated meanwhile); the intent stays pending, never "failed" by it.
    2. An in-flight answer waits on the same key (IN_PROGRESS), unless the
       profile's retry hint header says ``false``: the provider asks not to
       retry (stripe-python and stripe-node read Stripe-Should-Retry before
       their 409 rule). Then it is INDETERMINATE when ``key_seen`` (the key is
       in use by an earlier attempt of this intent, whose effect is unknown),
       FINAL when not. This holds for every profile with a retry hint header.
    3. A retry hint of ``true`` is RETRYABLE.
    4. An answer the profile documents as "outcome unknown" (``indeterminate``)
       is INDETERMINATE.
    5. A retry hint of ``false`` ends the intent: INDETERMINATE for a 5xx (it
       may have been executed; Stripe calls a 500 indeterminate), FINAL below.
    6. The profile's ``retryable`` rules, then its retryable statuses: RETRYABLE.
    7. Any other 5xx, by ``server_errors``: RETRYABLE, or INDETERMINATE where it
       ends the intent without proving the effect absent (a replayed 5xx; a 5xx
       without a true hint under ``"hint"``).
    8. Anything else, 2xx and 4xx (the provider said no), is FINAL.

    ``key_seen``: an earlier attempt with this key may have reached the server
    (it was ambiguous, or answered). Only then can the key have been used
    before, so only then is a key-reuse answer believed; to the first send of a
    fresh key the same status is an ordinary answer (a validation 422, say).
    """
    if status < 400:  # the common case: no rule or hint applies below 400
        return Outcome.RETRYABLE if status in provider.retryable_statuses else Outcome.FINAL
    codes: frozenset[str] | str = error_codes(body) if _needs_body(provider) else ""
    if key_seen and _any(provider.mismatch, status, codes, headers):
        return Outcome.MISMATCH
    if key_seen and status in AUTH_REFUSED:
        # Refused at the door, before any idempotency layer: this send did nothing,
        # and it says nothing of the earlier one, which may have been executed.
        return Outcome.RETRYABLE
    hint = None
    if provider.retry_hint_header is not None:
        hint = _truthy(headers.get(provider.retry_hint_header))
    if _any(provider.in_flight, status, codes, headers):
        if hint is False:
            return Outcome.INDETERMINATE if key_seen else Outcome.FINAL
        return Outcome.IN_PROGRESS
    if hint is True:
        return Outcome.RETRYABLE
    if _any(provider.indeterminate, status, codes, headers):
        return Outcome.INDETERMINATE
    if hint is False:
        return Outcome.INDETERMINATE if status >= 500 else Outcome.FINAL
    if status in provider.retryable_statuses or _any(provider.retryable, status, codes, headers):
        return Outcome.RETRYABLE
    if status >= 500:
        return _server_error(headers, provider)
    return Outcome.FINAL


def _any(
    rules: tuple[StatusRule, ...],
    status: int,
    codes: frozenset[str] | str,
    headers: Mapping[str, str],
) -> bool:
    return any(_matches(rule, status, codes, headers) for rule in rules)


def _needs_body(provider: Provider) -> bool:
    """Whether any of the profile's rules reads an error code (else the body is not parsed)."""
    rules = (*provider.mismatch, *provider.in_flight, *provider.indeterminate, *provider.retryable)
    return any(rule.code is not None for rule in rules)


def _server_error(headers: Mapping[str, str], provider: Provider) -> Outcome:
    """A 5xx no rule, hint or retryable status settled, read by the provider's 5xx rule."""
    rule = provider.server_errors
    if rule == "hint":
        # The hint was absent: the provider says not to retry, and says nothing of
        # whether the request was executed.
        return Outcome.INDETERMINATE
    if rule == "replayed" and is_replay(headers, provider):
        # The answer stored for this key: no retry can change it, and a 5xx stored
        # while executing does not prove the effect absent.
        return Outcome.INDETERMINATE
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
