"""Who may send an intent, and where: origins and sender identities.

A client's credentials belong to its origins (``scheme://host:port``); an
intent belongs to the origin it is addressed to and to the sender that wrote
it. A sender's identity is its ``name=``, or by default its provider's name
and a slow (PBKDF2) hash of the credentials it sends with, so two clients that differ
only in their API keys never send each other's intents. The credentials
themselves are never stored, in any spelling. Pure functions of their inputs.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterable
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_SECRET_PARAMS",
    "auth_material",
    "check_name",
    "client_origins",
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


@functools.lru_cache(maxsize=64)
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
