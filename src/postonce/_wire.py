"""From a caller's request arguments to the intent that is stored, and back to the wire.

The stored request is exactly what goes on the wire, less the secret headers
(which stay in memory) and, for header-borne keys, less the key header (which
is added from the stored key at every send). A body-borne key is injected into
the stored JSON body, so every later send carries it unchanged.
"""

from __future__ import annotations

import functools
import json as jsonlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

import httpx

from ._exceptions import ConfigurationError, InvalidKey, InvalidRequest
from ._keys import canonical_form, check_form, check_key, fingerprint, mint_key, unstorable
from ._memo import ByIdentity
from ._sender import DEFAULT_SECRET_PARAMS, call_account, origin_of
from .providers import Provider

__all__ = [
    "DEFAULT_SECRET_HEADERS",
    "UNSET",
    "Prepared",
    "parsed_url",
    "prepare",
    "supplied_secrets",
    "wire_headers",
]

#: Headers that never reach the outbox; ``Client(secret_headers=...)`` adds more. Besides
#: HTTP's own credential headers, the API-key headers in common use: ``X-API-Key`` (AWS
#: API Gateway, Adyen), ``Api-Key`` (Azure), ``apikey`` (Kong, Supabase), ``X-Auth-Token``
#: (OpenStack), ``X-Access-Token`` and ``Private-Token`` (GitLab). A name here costs a
#: header that is not a credential only its copy in the outbox: a drain sends the
#: client's own, and a call's own is marked as needed (``IntentRecord.needs``).
DEFAULT_SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "apikey",
        "x-auth-token",
        "x-access-token",
        "private-token",
    }
)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given", where ``None`` is a value (``json=None`` sends ``null``).
UNSET: Any = _Unset()

#: ``json.dumps(ensure_ascii=False, separators=(",", ":"), allow_nan=False)``, built
#: once: dumps makes a new encoder per call for any non-default option.
COMPACT_JSON = jsonlib.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)

HeaderInput = Mapping[str, str] | Sequence[tuple[str, str]] | httpx.Headers | None


class Prepared(NamedTuple):
    """A request ready to become an intent."""

    reference: str
    key: str
    key_given: bool
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]  # stored: non-secret, with content-type
    secret_headers: tuple[tuple[str, str], ...]  # this call's secrets: memory only
    body: bytes
    fingerprint: str
    origin: str | None = None  # scheme://host:port of ``url``
    secret_params: tuple[tuple[str, str], ...] = ()  # this call's secret query: memory only
    #: The names of the secrets this call brought that its client does not send
    #: (headers in lower case, query parameters as ``?name``): stored, never the values.
    needs: tuple[str, ...] = ()


def _encode_body(
    method: str, json: object, content: object, data: object, reference: str | None
) -> tuple[bytes, str | None]:
    given = [
        name for name, v in (("json", json), ("content", content), ("data", data)) if v is not UNSET
    ]
    if len(given) > 1:
        raise InvalidRequest(f"pass one body, not {' and '.join(given)}", reference=reference)
    if json is not UNSET:
        try:
            body = COMPACT_JSON.encode(json).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(
                f"the body is not JSON-serialisable: {exc}", reference=reference
            ) from exc
        return body, "application/json"
    if content is not UNSET:
        if isinstance(content, str):
            return content.encode(), None
        if isinstance(content, bytes | bytearray | memoryview):
            return bytes(content), None
        raise InvalidRequest(
            "content must be bytes or str: a stream cannot be stored and sent again",
            reference=reference,
        )
    if data is not UNSET:
        if isinstance(data, Mapping):
            check_form(data, reference=reference)
        try:
            encoded = httpx.Request(method, "http://postonce.invalid/", data=data)  # type: ignore[arg-type]
        except TypeError as exc:
            raise InvalidRequest(
                f"data cannot be form-encoded: {exc}", reference=reference
            ) from exc
        return encoded.read(), encoded.headers.get("content-type")
    return b"", None


@functools.lru_cache(maxsize=512)
def parsed_url(url_type: Any, url: str) -> httpx.URL:
    """A URL parsed once: services post to a few URLs many times, and URLs are immutable."""
    parsed: httpx.URL = url_type(url)
    return parsed


@functools.lru_cache(maxsize=512)
def _joined(base: httpx.URL, url: httpx.URL) -> httpx.URL:
    """``url`` under ``base`` as httpx joins them (URLs are immutable: joined once)."""
    return base.copy_with(raw_path=base.raw_path + url.raw_path.lstrip(b"/"))


def merge_url(
    http: httpx.Client | httpx.AsyncClient, url: httpx.URL | str, params: Any
) -> httpx.URL:
    """The URL a call addresses: ``base_url`` joined as httpx joins it, the call's params merged.

    The client's own ``params=`` are left out: httpx adds them at every send,
    so they are never stored (they may hold credentials).
    """
    # The client's own URL type: httpx's, or httpx2's for an httpx2 client.
    url_type: Any = type(http.base_url)
    merged: httpx.URL
    if isinstance(url, url_type):
        merged = url
    else:
        merged = parsed_url(url_type, url if isinstance(url, str) else str(url))
    if merged.is_relative_url and http.base_url:
        merged = _joined(http.base_url, merged)
    if params is not None:
        # httpx's rule: call params replace the URL's own query.
        merged = merged.copy_with(params=params)
    return merged


def check_url(merged: httpx.URL, origins: frozenset[str] | None, reference: str | None) -> str:
    """Refuse a URL that cannot be sent, or that would carry credentials off the client's origins.

    Answers the URL's origin. Userinfo is refused rather than dropped: it is a
    credential, and silently sending without it would fail in a way that
    looks like the provider's.
    """
    if merged.is_relative_url:
        raise InvalidRequest(
            f"{str(merged)!r} is a relative URL and this client has no base_url; "
            "pass an absolute URL or give the client base_url=",
            reference=reference,
        )
    if merged.scheme not in ("http", "https"):
        raise InvalidRequest(
            f"cannot send to a {merged.scheme!r} URL: only http and https", reference=reference
        )
    if merged.userinfo:
        raise InvalidRequest(
            "the URL carries credentials (user:password@): put credentials in auth= or "
            "headers=, which are never stored",
            reference=reference,
        )
    origin = origin_of(str(merged))
    if origin is None:
        raise InvalidRequest(f"cannot send to {str(merged)!r}: no host", reference=reference)
    if origins is not None and origin not in origins:
        raise InvalidRequest(
            f"{origin} is not one of this client's origins ({', '.join(sorted(origins))}): its "
            "headers and auth are sent only there; use a client made for that origin, or list "
            "it in origins=",
            reference=reference,
        )
    return origin


def split_secret_params(
    merged: httpx.URL, secret_params: Collection[str]
) -> tuple[httpx.URL, tuple[tuple[str, str], ...]]:
    """The URL without its secret query parameters, and those parameters (for memory only)."""
    if not merged.query:
        return merged, ()
    pairs = merged.params.multi_items()
    secret = tuple((n, v) for n, v in pairs if n.lower() in secret_params)
    if not secret:
        return merged, ()
    kept = [(n, v) for n, v in pairs if n.lower() not in secret_params]
    return merged.copy_with(params=kept), secret


def _adopt(found: str | None, key: str | None, where: str, reference: str | None) -> str | None:
    """A key the caller put in the request itself counts as ``key=``; two keys must agree."""
    if found is None:
        return key
    if key is not None and key != found:
        raise InvalidKey(f"key= and the {where} name different keys; pass one", reference=reference)
    return found


#: The stored URL, its origin, its request target (path and query) and the
#: secret query parameters taken out of it.
Address = tuple[str, str, str, tuple[tuple[str, str], ...]]

#: Where a call's URL resolves, by base URL object, then url, origins and secret
#: parameters: a service posts to a few URLs many times. See :func:`address`.
_ADDRESSES: ByIdentity[Address] = ByIdentity(512)


def address(
    http: httpx.Client | httpx.AsyncClient,
    url: httpx.URL | str,
    params: Any,
    origins: frozenset[str] | None,
    secret_params: Collection[str],
    reference: str | None,
) -> Address:
    """Where a call goes: :func:`merge_url`, :func:`check_url`, :func:`split_secret_params`.

    A refused URL raises InvalidRequest naming ``reference``. A URL given as a
    ``str`` without ``params`` is resolved once per client base URL: the answer
    is kept by the base URL object's identity (httpx replaces it when
    ``base_url`` is set), and only an accepted URL is kept.
    """
    secrets = secret_params if isinstance(secret_params, frozenset) else None
    cacheable = params is None and type(url) is str and secrets is not None
    base = http.base_url
    if cacheable:
        found = _ADDRESSES.get(base, url, origins, secrets)
        if found is not None:
            return found
    try:
        merged = merge_url(http, url, params)
    except Exception as exc:
        # httpx's or httpx2's InvalidURL (they share no base), or a bad params value.
        if not isinstance(exc, TypeError | ValueError) and type(exc).__name__ != "InvalidURL":
            raise
        raise InvalidRequest(f"httpx cannot build this URL: {exc}", reference=reference) from exc
    origin = check_url(merged, origins, reference)
    merged, secret_query = split_secret_params(merged, secret_params)
    answer = (str(merged), origin, merged.raw_path.decode("ascii"), secret_query)
    # Kept only if merge_url joined to the base of the key (another thread may
    # have set base_url meanwhile).
    if cacheable and http.base_url is base:
        _ADDRESSES.put(base, answer, url, origins, secrets)
    return answer


def prepare(
    http: httpx.Client | httpx.AsyncClient,
    method: str,
    url: httpx.URL | str,
    *,
    provider: Provider,
    intent: str | None,
    key: str | None,
    json: object = UNSET,
    content: object = UNSET,
    data: object = UNSET,
    params: Any = None,
    headers: HeaderInput = None,
    secret_names: Collection[str] = DEFAULT_SECRET_HEADERS,
    fingerprint_fields: Sequence[str] | None = None,
    origins: frozenset[str] | None = None,
    secret_params: Collection[str] = DEFAULT_SECRET_PARAMS,
) -> Prepared:
    """Check, encode and fingerprint one call. Raises InvalidRequest, stores nothing."""
    method = method.upper()
    if intent is not None and (not isinstance(intent, str) or not intent or len(intent) > 1024):
        raise InvalidRequest("intent= must be a non-empty str of at most 1024 characters")
    if intent is not None and (bad := unstorable(intent)) is not None:
        # Not named in the error: its text is what cannot be kept (or shown) anywhere.
        what, index = bad
        raise InvalidRequest(
            f"intent= holds {what} at index {index}, which no outbox can store "
            "(PostgreSQL refuses a NUL, and a lone surrogate has no UTF-8 spelling); "
            "nothing was stored or sent"
        )
    # Most calls bring no headers of their own: no Headers object to build then.
    call_headers = httpx.Headers(headers) if headers else None
    key, key_given, json = _key_of(provider, call_headers, json, key, intent)
    reference = intent if intent is not None else key

    stored_url, origin, target, secret_query = address(
        http, url, params, origins, secret_params, reference
    )
    body, content_type, json_body, raw_body = _encoded(
        provider, method, key, json, content, data, reference
    )
    stored, secret = split_headers(call_headers, content_type, secret_names)
    # Most calls have neither scope headers nor secrets of their own: nothing to look at.
    scope = scope_headers(http, provider, stored, secret_names) if provider.scope_headers else []
    own = call_secrets(http, secret, secret_query) if secret or secret_query else []
    account = call_account(provider.name, provider.credentials, own) if own else None
    if account is not None:
        scope.append(("account", account))
    digest = fingerprint(
        method,
        target,
        json_body=json_body,
        raw_body=raw_body,
        is_json=json_body is not UNSET,
        fields=fingerprint_fields,
        reference=reference,
        scope=scope,
    )
    return Prepared(
        reference=reference,
        key=key,
        key_given=key_given,
        method=method,
        url=stored_url,
        headers=tuple(stored),
        secret_headers=secret,
        body=body,
        fingerprint=digest,
        origin=origin,
        secret_params=secret_query,
        needs=needs_of(own) if own else (),
    )


def _key_of(
    provider: Provider,
    call_headers: httpx.Headers | None,
    json: object,
    key: str | None,
    intent: str | None,
) -> tuple[str, bool, object]:
    """The call's key (given, found in its header or body, or minted), whether it was given,
    and the JSON body without a body-borne key. ``call_headers`` loses a key header."""
    field = provider.key_field
    body_key = provider.key_transport == "body"
    if not body_key and call_headers is not None:
        key = _adopt(call_headers.get(field), key, f"{field} header", intent)
        if field in call_headers:
            del call_headers[field]
    if body_key and json is not UNSET and isinstance(json, dict) and field in json:
        found = json[field]
        key = _adopt(found if isinstance(found, str) else repr(found), key, "body", intent)
        json = {k: v for k, v in json.items() if k != field}
    if key is not None:
        return check_key(key, provider, reference=intent), True, json
    try:
        return check_key(mint_key(), provider, reference=intent), False, json
    except InvalidKey as exc:
        raise ConfigurationError(
            f"the {provider.name} profile's key rules reject the UUIDv4 keys postonce "
            f"mints ({exc.message}); pass key= with a key of your own on every call, "
            "or relax the profile",
            reference=intent,
        ) from None


def _encoded(
    provider: Provider,
    method: str,
    key: str,
    json: object,
    content: object,
    data: object,
    reference: str,
) -> tuple[bytes, str | None, object, bytes]:
    """The body to store, its content type, and what the fingerprint hashes of it: the JSON
    body (``UNSET`` for any other), and the raw bytes of any other."""
    if provider.key_transport != "body":
        body, content_type = _encode_body(method, json, content, data, reference)
        # A form is hashed with its fields in name order, as JSON is with sorted keys.
        raw = canonical_form(data) if isinstance(data, Mapping) else body
        return body, content_type, json, raw
    field = provider.key_field
    if json is UNSET or not isinstance(json, dict):
        raise InvalidRequest(
            f"{provider.name} takes the key in the JSON body field {field!r}: "
            "pass json= with an object",
            reference=reference,
            key=key,
        )
    # The fingerprint is of the body without its key: a new call mints a new one.
    body, content_type = _encode_body(method, {**json, field: key}, UNSET, UNSET, reference)
    return body, content_type, json, b""


def split_headers(
    call_headers: httpx.Headers | None, content_type: str | None, secret_names: Collection[str]
) -> tuple[list[tuple[str, str]], tuple[tuple[str, str], ...]]:
    """A call's headers as stored (non-secret, with the body's content type) and its secrets."""
    stored: list[tuple[str, str]] = []
    if call_headers is None:
        if content_type is not None:
            stored.append(("content-type", content_type))
        return stored, ()
    if content_type is not None and "content-type" not in call_headers:
        call_headers["content-type"] = content_type
    secrets = {name.lower() for name in secret_names}
    secret: list[tuple[str, str]] = []
    for name, value in call_headers.multi_items():
        (secret if name.lower() in secrets else stored).append((name, value))
    return stored, tuple(secret)


def scope_headers(
    http: httpx.Client | httpx.AsyncClient,
    provider: Provider,
    stored: list[tuple[str, str]],
    secret_names: Collection[str],
) -> list[tuple[str, str]]:
    """The profile's scope headers this request carries, as ``(name, value)`` for the fingerprint.

    A scope header the client sets for every call is copied into ``stored``
    (the call's own wins, as httpx merges them): the intent then names its
    account itself, and a drain of a client without that header still sends
    it there. ``secret_names`` are lower case; a secret scope header is never stored.
    """
    names = [name for name in provider.scope_headers if name not in secret_names]
    found = [(name.lower(), value) for name, value in stored if name.lower() in names]
    given = {name for name, _ in found}
    # Read raw: a client's few headers, compared as bytes (no decoding of the others).
    wanted = {name.encode(): name for name in names if name not in given}
    if wanted:
        headers = http.headers
        for raw_name, raw_value in headers.raw:
            name = wanted.get(raw_name.lower())
            if name is not None:
                value = raw_value.decode(headers.encoding)
                stored.append((name, value))
                found.append((name, value))
    return found


def call_secrets(
    http: httpx.Client | httpx.AsyncClient,
    secret: Sequence[tuple[str, str]],
    secret_query: Sequence[tuple[str, str]],
) -> list[tuple[str, str]]:
    """The secrets a call brings that its client does not send itself: the call's own.

    Query parameters come as ``("?name", value)``. A secret equal to the
    client's own (the same header value, the same parameter value) is not the
    call's: any client of this sender sends it.
    """
    if not secret and not secret_query:
        return []
    headers, params = http.headers, http.params
    own = [(name, value) for name, value in secret if headers.get(name) != value]
    own.extend((f"?{name}", value) for name, value in secret_query if params.get(name) != value)
    return own


def needs_of(own: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """What an intent needs from whoever sends it again: the names of the call's own secrets.

    Header names in lower case (they compare so); query parameters as ``?name``,
    as written (their names are case-sensitive).
    """
    return tuple(sorted({name if name[0] == "?" else name.lower() for name, _ in own}))


def supplied_secrets(
    needs: Sequence[str], supplied: object
) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """The secrets a ``credentials_for`` callback supplied for an intent that ``needs`` them.

    Returns ``(headers, query parameters)`` to send with. ``supplied`` maps each
    name in ``needs`` (a header name in any case; a query parameter as ``?name``)
    to its value; other names are ignored. Raises ``ConfigurationError`` naming
    what is missing: the intent is then not sent at all, never sent without them.
    """
    if supplied is None:
        raise ConfigurationError(
            f"it was sent with credentials of its own call ({', '.join(needs)}) and "
            "credentials_for= supplied none"
        )
    if not isinstance(supplied, Mapping):
        raise ConfigurationError(
            f"credentials_for= must return a mapping of {', '.join(needs)} to their values "
            f"(or None), not {type(supplied).__name__}"
        )
    given = {(name if name[:1] == "?" else name.lower()): value for name, value in supplied.items()}
    missing = [name for name in needs if not isinstance(given.get(name), str)]
    if missing:
        raise ConfigurationError(
            f"credentials_for= supplied no string value for {', '.join(missing)}, which its "
            "own call sent"
        )
    headers = tuple((name, given[name]) for name in needs if name[0] != "?")
    params = tuple((name[1:], given[name]) for name in needs if name[0] == "?")
    return headers, params


def wire_headers(
    stored: Sequence[tuple[str, str]],
    secret: Sequence[tuple[str, str]],
    key: str,
    provider: Provider,
) -> list[tuple[str, str]]:
    """The headers of one send: stored, then secrets, then the raw key header."""
    out = [*stored, *secret]
    if provider.key_transport == "header":
        out.append((provider.key_field, key))
    return out
