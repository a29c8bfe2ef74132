"""Who may send an intent, and where: origins and sender identities.

A client's credentials belong to its origins (``scheme://host:port``); an
intent belongs to the origin it is addressed to and to the sender that wrote
it. A sender's identity is its ``name=``, or by default its provider's name
and a slow (PBKDF2) hash of the credentials that name its account, so two clients
that differ only in their API keys never send each other's intents. Only what
stays the same while the account does may name it: a long-lived key, a JWT's
issuer and subject; never an access token that is refreshed (the next process
would be another sender, and the intents of this one no one's). Where postonce
cannot tell, the client must be given ``name=``. The credentials themselves are
never stored, in any spelling. Pure functions of their inputs.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_SECRET_PARAMS",
    "account_names",
    "auth_material",
    "call_account",
    "check_name",
    "client_origins",
    "client_sender",
    "origin_of",
    "sender_identity",
]

DEFAULT_PORTS = {"http": 80, "https": 443}

#: Query parameters that carry credentials: never stored, re-added at each send.
#: ``Client(secret_params=...)`` adds more.
DEFAULT_SECRET_PARAMS = frozenset(
    {"api_key", "apikey", "access_token", "token", "client_secret", "key", "signature", "password"}
)

# The salt of identities. Not a secret: it separates these hashes from any other
# use of the same credentials. What keeps a credential from being guessed back
# from the stored identity is PBKDF2's work factor (a weak Basic-auth password
# costs a guesser 100,000 HMACs a try) and that only 64 bits are kept.
_IDENTITY_SALT = b"postonce sender identity v2"
_IDENTITY_ROUNDS = 100_000


@functools.lru_cache(maxsize=1024)
def origin_of(url: str) -> str | None:
    """``scheme://host:port`` of an absolute http(s) URL (default ports spelled out), else None.

    Hosts compare case-insensitively and a default port equals its absence, as
    httpx compares origins when it strips credentials from a redirect.
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return f"{scheme}://{host}:{port if port is not None else DEFAULT_PORTS[scheme]}"


def client_origins(base_url: str, origins: Iterable[str] | None) -> frozenset[str] | None:
    """The origins a client's credentials may go to: ``origins=``, else ``base_url``'s.

    None: the client named neither, so it has no origin of its own. Raises
    ValueError naming an entry that is not an absolute http(s) URL.
    """
    if origins is not None:
        if isinstance(origins, str):
            origins = [origins]
        found = set()
        for entry in origins:
            origin = origin_of(entry) if isinstance(entry, str) else None
            if origin is None:
                raise ValueError(
                    f"origins= takes http(s) URLs like https://api.example.com: {entry!r}"
                )
            found.add(origin)
        if not found:
            raise ValueError("origins= needs at least one origin")
        return frozenset(found)
    if base_url:
        origin = origin_of(base_url)
        if origin is None:
            raise ValueError(f"base_url must be an absolute http(s) URL, not {base_url!r}")
        return frozenset({origin})
    return None


def check_name(name: object) -> str:
    """A sender name as given, or ValueError: non-empty printable text of at most 200 characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValueError("name= must be a non-empty str of at most 200 characters")
    if not name.isprintable():
        raise ValueError("name= must be printable text (no control characters)")
    return name


def auth_material(auth: Any) -> list[tuple[str, str]]:
    """What of an httpx ``auth`` identifies its credentials, as hashable pairs (never stored).

    Basic and digest credentials, and a (user, password) tuple, by value; a
    function by its qualified name; any other auth class by its name only —
    two such clients need distinct ``name=`` values to keep their intents apart.
    """
    if auth is None:
        return []
    if isinstance(auth, tuple):
        return [("auth", "\x00".join(str(part) for part in auth))]
    header = getattr(auth, "_auth_header", None)
    if isinstance(header, str):
        return [("auth", header)]
    username, password = getattr(auth, "_username", None), getattr(auth, "_password", None)
    if isinstance(username, bytes) and isinstance(password, bytes):
        return [("auth", f"{username!r}\x00{password!r}")]
    func = getattr(auth, "_func", auth)
    return [("auth-type", getattr(func, "__qualname__", type(auth).__qualname__))]


def sender_identity(
    name: str | None, provider: str, credentials: Collection[tuple[str, str]]
) -> str:
    """The identity an intent is stored under: ``name``, or ``provider#<slow hash>``.

    ``credentials`` are ``(name, value)`` pairs (secret headers, secret query
    parameters, auth material); only 64 bits of a PBKDF2 of them are kept,
    never the values. The same credentials give the same identity in every process.
    """
    if name is not None:
        return name
    return _derived(provider, tuple(sorted((k.lower(), v) for k, v in credentials)))


# Many entries: a platform derives one per merchant whose key its calls bring.
@functools.lru_cache(maxsize=1024)
def _derived(provider: str, credentials: tuple[tuple[str, str], ...]) -> str:
    if not credentials:  # nothing to hide: no work factor needed
        return f"{provider}#{hashlib.sha256(_IDENTITY_SALT + provider.encode()).hexdigest()[:16]}"
    material = b"".join(
        b"\x00" + key.encode() + b"\x01" + value.encode("utf-8", "surrogateescape")
        for key, value in credentials
    )
    digest = hashlib.pbkdf2_hmac(
        "sha256", provider.encode() + material, _IDENTITY_SALT, _IDENTITY_ROUNDS
    )
    return f"{provider}#{digest.hex()[:16]}"


# -- which credentials name an account ------------------------------------------------------

#: Parts of a secret's name that say its value changes while the account stays: an
#: access or session token, a cookie, a per-request signature. Such a value never
#: names a sender (``X-Auth-Token`` may be a long-lived key: postonce cannot tell, so
#: it asks for ``name=`` rather than guess).
_CHANGING_PARTS = ("token", "session", "cookie", "signature")
#: Secrets whose value is made anew for each request.
_PER_REQUEST = frozenset({"x-amz-date", "sig"})
_AUTHORIZATION = frozenset({"authorization", "proxy-authorization"})


def _jwt_account(token: str) -> str | None:
    """A JWT's issuer and subject (``sub``, else ``client_id``), or None if it is not one.

    RFC 9068 requires both claims in a JWT access token: they name the account
    the token acts for and stay the same when the token is refreshed. Read, not
    verified: the value only groups this application's own intents.
    """
    parts = token.split(".")
    if len(parts) != 3 or not parts[0].startswith("eyJ"):
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):  # not base64url, not UTF-8, not JSON
        return None
    if not isinstance(claims, dict):
        return None
    issuer, subject = claims.get("iss"), claims.get("sub") or claims.get("client_id")
    if not (isinstance(issuer, str) and issuer and isinstance(subject, str) and subject):
        return None
    return f"jwt\x00{issuer}\x00{subject}"


def _naming(name: str, value: str, credentials: str | None) -> str | None:
    """The part of one credential that names its account, or None if it cannot.

    ``credentials`` is the profile's word on what ``Authorization`` carries
    (``"api_key"``, ``"token"`` or None). Basic credentials are a user and a
    password: long-lived whatever the profile says.
    """
    lowered = name.lower()
    if lowered in _AUTHORIZATION:
        scheme, _, rest = value.strip().partition(" ")
        if rest and scheme.lower() == "basic":
            return value
        jwt = _jwt_account(rest.strip() if rest else scheme)
        if jwt is not None:
            return jwt
        # A proxy's credentials are not the provider's: its profile says nothing of them.
        return value if lowered == "authorization" and credentials == "api_key" else None
    if lowered in _PER_REQUEST or any(part in lowered for part in _CHANGING_PARTS):
        return None
    return value


def account_names(
    pairs: Iterable[tuple[str, str]], credentials: str | None
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(name, value)`` pairs that name an account, and the names of those that cannot."""
    named: list[tuple[str, str]] = []
    doubtful: list[str] = []
    for name, value in pairs:
        naming = _naming(name, value, credentials)
        if naming is None:
            doubtful.append(name)
        else:
            named.append((name, naming))
    return named, doubtful


def client_sender(
    name: str | None,
    provider: str,
    credentials: str | None,
    pairs: Sequence[tuple[str, str]],
) -> str:
    """A client's sender: ``name``, else derived from the credentials that name its account.

    ``pairs`` are its secret headers, secret query parameters and auth material.
    Raises ValueError, saying how to fix it, when it has credentials and none of
    them can name its account (an access token that is refreshed, or a Bearer
    the profile does not classify): a sender derived from those would change
    at each refresh. A client whose every credential names its account gets the
    identity earlier versions gave it.
    """
    if name is not None:
        return name
    named, doubtful = account_names(pairs, credentials)
    if doubtful and not named:
        raise ValueError(_name_needed(provider, credentials, doubtful, pairs))
    return sender_identity(None, provider, named)


def _name_needed(
    provider: str, credentials: str | None, doubtful: list[str], pairs: Sequence[tuple[str, str]]
) -> str:
    # httpx hands header names over in lower case: shown as they are usually written.
    header = ", ".join(sorted({name if "_" in name else name.title() for name in doubtful}))
    authorization = any(name.lower() == "authorization" for name in doubtful)
    if credentials == "token" and authorization:
        why = f"the {provider} profile's Authorization carries an access token that is refreshed"
    else:
        why = (
            f"postonce cannot tell whether its {header} is a long-lived key or a token that "
            "is refreshed"
        )
    declare = (
        "; a long-lived API key in Authorization can instead be declared by its profile: "
        f"provider=postonce.get_provider({provider!r}).model_copy(update={{'credentials': "
        "'api_key'}})"
        if authorization and credentials is None
        else ""
    )
    # What earlier versions derived from these credentials: the intents they wrote wait there.
    previous = sender_identity(None, provider, pairs)
    return (
        f"this client needs name=: {why}, and a sender derived from a refreshed token changes "
        "with it, leaving the intents of the previous process to no one. Give the client a "
        "fixed name=, the same in every process and drain of this application (e.g. "
        f"name='payments'){declare}. Intents these credentials wrote before are stored under "
        f"sender {previous!r}: take them over with client.adopt({previous!r})"
    )


def call_account(
    provider: str, credentials: str | None, pairs: Sequence[tuple[str, str]]
) -> str | None:
    """The account a call's own credentials name (a slow hash), or None if none does.

    For a call that brings its own key (a platform sending for each merchant):
    it belongs to the intent's fingerprint, so the same intent under another
    account's key is a conflict, not the same request. Credentials that cannot
    name an account (a refreshed token) are left out: they would make a resume
    under the next token a conflict.
    """
    named, _ = account_names(pairs, credentials)
    if not named:
        return None
    return _derived(provider, tuple(sorted((k.lower(), v) for k, v in named)))
