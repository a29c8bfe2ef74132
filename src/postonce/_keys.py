"""Keys and fingerprints: minting, checking and hashing. Pure functions."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from ._exceptions import InvalidKey, InvalidRequest
from .providers import Provider

__all__ = [
    "canonical_form",
    "canonical_json",
    "check_form",
    "check_key",
    "fingerprint",
    "mint_key",
    "unstorable",
]

_SCALARS = (str, int, float, bool, type(None))

# Printable ASCII less '"' and '\': a key must travel as the raw field value,
# and these are the characters that would need quoting or escaping.
_RAW_SAFE = re.compile(r"[!#-\[\]-~]+")


def mint_key() -> str:
    """A fresh canonical UUIDv4: 36 characters, accepted by every built-in profile.

    ``str(uuid.uuid4())`` from the same 16 random bytes, spelled directly
    (a third of the time: every ``post_once`` without ``key=`` mints one).
    The version nibble is 4; the variant's two top bits are 10 (8, 9, a or b).
    """
    h = os.urandom(16).hex()
    variant = "89ab"[int(h[16], 16) & 3]
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant}{h[17:20]}-{h[20:]}"


def unstorable(text: str) -> tuple[str, int] | None:
    """The first character no outbox can store, as (what it is, its index); None if none.

    A NUL: PostgreSQL's text refuses it while SQLite keeps it, so an intent
    would be storable on one backend and not on another. A lone surrogate
    (``"\\ud800"``, as a bad decode leaves): no UTF-8 spelling exists, so no
    backend can write it. Plain ASCII without a NUL, the usual text, is
    answered without a scan in Python.
    """
    if "\x00" not in text and text.isascii():
        return None
    for index, char in enumerate(text):
        if char == "\x00":
            return "a NUL character", index
        if "\ud800" <= char <= "\udfff":
            return f"a lone surrogate ({char!a})", index
    return None


def check_key(key: object, provider: Provider, *, reference: str | None) -> str:
    """Return ``key`` if it can travel raw under ``provider``, else raise InvalidKey."""
    if not isinstance(key, str):
        raise InvalidKey(f"a key must be a str, not {type(key).__name__}", reference=reference)
    shown = key if len(key) <= 40 else key[:37] + "..."
    if not _RAW_SAFE.fullmatch(key):
        raise InvalidKey(
            f"key {shown!r} must be printable ASCII without quotes, backslashes, spaces "
            "or control characters (keys go on the wire raw, never quoted)",
            reference=reference,
        )
    if not provider.key_min_length <= len(key) <= provider.key_max_length:
        raise InvalidKey(
            f"key {shown!r} has {len(key)} characters; {provider.name} takes "
            f"{provider.key_min_length} to {provider.key_max_length}",
            reference=reference,
        )
    if provider.key_pattern is not None and not re.fullmatch(provider.key_pattern, key):
        raise InvalidKey(
            f"key {shown!r} does not match {provider.name}'s key format {provider.key_pattern!r}",
            reference=reference,
        )
    return key


#: ``json.dumps(sort_keys=True, ...)`` without a new encoder per call (dumps makes
#: one for any non-default option); an encoder holds no state between calls.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: object) -> bytes:
    """JSON with sorted keys and no insignificant whitespace; raises ValueError/TypeError."""
    return _CANONICAL.encode(value).encode()


def check_form(data: Mapping[Any, Any], *, reference: str | None) -> None:
    """Refuse a form body httpx would mangle: a nested dict, or a list holding one.

    httpx form-encodes a nested value as its Python repr (``"{'order_id': 'N1'}"``);
    form APIs spell nesting in the field name instead. A list of scalars is a
    repeated field, and fine.
    """
    for name, value in data.items():
        if isinstance(value, _SCALARS):
            continue
        if isinstance(value, list | tuple) and all(isinstance(v, _SCALARS) for v in value):
            continue
        kind = "dict" if isinstance(value, Mapping) else type(value).__name__
        inner = next(iter(value), "field") if isinstance(value, Mapping) else "0"
        raise InvalidRequest(
            f"data= field {name!r} holds a {kind}, which form encoding would turn into its "
            f"Python text; spell nesting in the field name, as form APIs do: "
            f"{name}[{inner}]=... (a list of plain values for a repeated field is fine)",
            reference=reference,
        )


def _form_text(value: object) -> str:
    # httpx's own spelling of form values (primitive_value_to_str).
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def canonical_form(data: Mapping[Any, Any]) -> bytes:
    """A form body with its fields sorted by name: field order does not change the fingerprint.

    The values of a repeated field keep their order (it can mean something).
    A form already in name order canonicalises to the bytes httpx sends.
    """
    pairs: list[tuple[str, str]] = []
    for name in sorted(data, key=str):
        value = data[name]
        for item in value if isinstance(value, list | tuple) else [value]:
            pairs.append((str(name), _form_text(item)))
    return urlencode(pairs).encode()


def _project(body: object, fields: Sequence[str], reference: str | None) -> dict[str, object]:
    if not isinstance(body, dict):
        raise InvalidRequest("fingerprint_fields needs a JSON object body", reference=reference)
    projected: dict[str, object] = {}
    for path in fields:
        node: object = body
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        projected[path] = node
    return projected


def fingerprint(
    method: str,
    target: str,
    *,
    json_body: object = None,
    raw_body: bytes = b"",
    is_json: bool,
    fields: Sequence[str] | None = None,
    reference: str | None = None,
    scope: Sequence[tuple[str, str]] = (),
) -> str:
    """SHA-256 of method, request target (path and query), a canonical body and its scope.

    A JSON body is hashed as canonical JSON, so key order and whitespace do not
    matter; with ``fields`` only those (dotted) fields count. Any other body is
    hashed as its raw bytes. ``scope`` is what chooses the account the request
    acts for besides the client's own credentials: ``(name, value)`` pairs of
    the profile's scope headers (``stripe-account``) and the account a call's own
    key names (``account``, a slow hash), in any order. A request with no scope
    hashes as it always has.
    """
    digest = hashlib.sha256()
    digest.update(method.upper().encode())
    digest.update(b"\n")
    digest.update(target.encode())
    if scope:
        # Between the target (which holds no raw newline) and the body's kind: no
        # unscoped request hashes these bytes, and a request with no scope hashes
        # as it always has (stored fingerprints still match).
        digest.update(b"\nscope ")
        digest.update(canonical_json(sorted([name.lower(), value] for name, value in scope)))
    # The body's kind is part of the request: JSON {"a":1} is not the raw bytes {"a":1}.
    digest.update(b"\njson\n" if is_json else b"\nraw\n")
    if is_json:
        projected = _project(json_body, fields, reference) if fields else json_body
        try:
            digest.update(canonical_json(projected))
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"the body is not JSON-serialisable: {exc}", reference=reference
            ) from exc
    elif fields:
        raise InvalidRequest("fingerprint_fields needs a JSON body", reference=reference)
    else:
        digest.update(raw_body)
    return digest.hexdigest()
