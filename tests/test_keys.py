"""Keys and fingerprints: minting, checking and hashing."""

from __future__ import annotations

import math
import re
import uuid

import httpx
import pytest

from postonce._exceptions import InvalidKey, InvalidRequest
from postonce._keys import canonical_form, check_form, check_key, fingerprint, mint_key
from postonce.providers import BUILTIN_PROVIDERS, Provider

STRIPE = BUILTIN_PROVIDERS["stripe"]
ADYEN = BUILTIN_PROVIDERS["adyen"]
RAZORPAY = BUILTIN_PROVIDERS["razorpay_payouts"]
LITHIC = BUILTIN_PROVIDERS["lithic"]

REFERENCE = "order-42"
A_UUID = "0b8f9d4e-6c1a-4f7b-9a2e-3d5c7b1e8f60"
CANONICAL_UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
# Every character the raw-key rule allows: printable ASCII less space, '"' and '\'.
ALL_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\')


def test_mint_key_is_canonical_uuid4() -> None:
    """mint_key returns a lower-case, hyphenated, version-4 RFC 4122 UUID, every time."""
    keys = [mint_key() for _ in range(2000)]
    for key in keys:
        assert CANONICAL_UUID4.fullmatch(key), key
        parsed = uuid.UUID(key)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == key
    # Every random hex position takes every value; the variant all four of its own.
    hexes = [key.replace("-", "") for key in keys]
    for position in (*range(12), *range(13, 16), *range(17, 32)):
        assert {h[position] for h in hexes} == set("0123456789abcdef"), position
    assert {h[16] for h in hexes} == set("89ab")


def test_mint_key_is_fresh_each_time() -> None:
    """Every call mints a different key."""
    keys = {mint_key() for _ in range(200)}
    assert len(keys) == 200


@pytest.mark.parametrize(
    ("key", "provider"),
    [
        pytest.param(A_UUID, STRIPE, id="uuid-stripe"),
        pytest.param(A_UUID.upper(), LITHIC, id="upper-uuid-lithic"),
        pytest.param(A_UUID, LITHIC, id="uuid-lithic"),
        pytest.param(ALL_SAFE, STRIPE, id="every-safe-char"),
        pytest.param("a" * 64, ADYEN, id="adyen-64-chars"),
        pytest.param("x", STRIPE, id="one-char"),
        pytest.param("abcd", RAZORPAY, id="razorpay-min-4"),
        pytest.param("Ab_9-z", RAZORPAY, id="razorpay-pattern"),
        pytest.param("a" * 36, RAZORPAY, id="razorpay-max-36"),
    ],
)
def test_check_key_accepts(key: str, provider: Provider) -> None:
    """A key that can travel raw under the provider comes back unchanged."""
    assert check_key(key, provider, reference=REFERENCE) == key


@pytest.mark.parametrize(
    ("key", "provider"),
    [
        pytest.param('"abc"', STRIPE, id="quoted"),
        pytest.param("ab c", STRIPE, id="space"),
        pytest.param("ab\\c", STRIPE, id="backslash"),
        pytest.param("ключ", STRIPE, id="non-ascii"),
        pytest.param("ab\x01c", STRIPE, id="control-char"),
        pytest.param("ab\tc", STRIPE, id="tab"),
        pytest.param("abc\n", STRIPE, id="trailing-newline"),
        pytest.param("ab\x7fc", STRIPE, id="del"),
        pytest.param("", STRIPE, id="empty"),
        pytest.param(12345, STRIPE, id="int"),
        pytest.param(b"abc", STRIPE, id="bytes"),
        pytest.param(None, STRIPE, id="none"),
        pytest.param(uuid.UUID(A_UUID), STRIPE, id="uuid-object"),
        pytest.param("a" * 300, ADYEN, id="adyen-300-chars"),
        pytest.param("a" * 65, ADYEN, id="adyen-65-chars"),
        pytest.param("a" * 256, STRIPE, id="stripe-256-chars"),
        pytest.param("abc", RAZORPAY, id="razorpay-below-min"),
        pytest.param("a" * 37, RAZORPAY, id="razorpay-above-max"),
        pytest.param("abc.def", RAZORPAY, id="razorpay-pattern-dot"),
        pytest.param("abc:def", RAZORPAY, id="razorpay-pattern-colon"),
        pytest.param("not-a-uuid", LITHIC, id="lithic-not-uuid"),
        pytest.param(A_UUID.replace("-", ""), LITHIC, id="lithic-unhyphenated"),
        pytest.param(A_UUID[:-1] + "g", LITHIC, id="lithic-non-hex"),
    ],
)
def test_check_key_refuses(key: object, provider: Provider) -> None:
    """A key the provider cannot take raw raises InvalidKey naming the reference."""
    with pytest.raises(InvalidKey) as info:
        check_key(key, provider, reference=REFERENCE)
    assert info.value.intent == REFERENCE
    assert REFERENCE in str(info.value)


def test_check_key_refusal_without_reference() -> None:
    """A refusal with no reference carries reference None."""
    with pytest.raises(InvalidKey) as info:
        check_key("a b", STRIPE, reference=None)
    assert info.value.intent is None


def test_invalid_key_is_invalid_request() -> None:
    """InvalidKey is caught by an InvalidRequest handler."""
    with pytest.raises(InvalidRequest):
        check_key("", STRIPE, reference=REFERENCE)


TARGET = "/v1/charges?expand=customer"
BODY: dict[str, object] = {
    "amount": 100,
    "currency": "eur",
    "customer": {"id": "cus_1", "email": "a@example.com"},
    "metadata": {"note": "x"},
}


def _json_fp(body: object, *, method: str = "POST", target: str = TARGET) -> str:
    return fingerprint(method, target, json_body=body, is_json=True)


def test_fingerprint_is_sha256_hex() -> None:
    """A fingerprint is a 64-character lower-case hex digest."""
    assert re.fullmatch(r"[0-9a-f]{64}", _json_fp(BODY))


def test_fingerprint_ignores_json_key_order() -> None:
    """Two dicts with the same items in a different insertion order fingerprint alike."""
    reordered: dict[str, object] = {
        "metadata": {"note": "x"},
        "customer": {"email": "a@example.com", "id": "cus_1"},
        "currency": "eur",
        "amount": 100,
    }
    assert list(reordered) != list(BODY)
    assert _json_fp(reordered) == _json_fp(BODY)


def test_fingerprint_ignores_json_whitespace() -> None:
    """For a JSON body the encoded bytes (and their whitespace) do not count."""
    compact = fingerprint("POST", TARGET, json_body={"a": 1}, raw_body=b'{"a":1}', is_json=True)
    spaced = fingerprint(
        "POST", TARGET, json_body={"a": 1}, raw_body=b'{ "a" : 1 }\n', is_json=True
    )
    assert compact == spaced


def test_fingerprint_method_case_does_not_matter() -> None:
    """The method is compared upper-cased."""
    assert _json_fp(BODY, method="post") == _json_fp(BODY, method="POST")


@pytest.mark.parametrize(
    ("method", "target", "body"),
    [
        pytest.param("POST", TARGET, {**BODY, "amount": 101}, id="value"),
        pytest.param("POST", TARGET, {**BODY, "amount": "100"}, id="value-type"),
        pytest.param(
            "POST",
            TARGET,
            {**BODY, "customer": {"id": "cus_2", "email": "a@example.com"}},
            id="nested",
        ),
        pytest.param("POST", TARGET, {**BODY, "extra": None}, id="extra-field"),
        pytest.param(
            "POST", TARGET, {k: v for k, v in BODY.items() if k != "metadata"}, id="dropped"
        ),
        pytest.param("PUT", TARGET, BODY, id="method"),
        pytest.param("POST", "/v1/refunds?expand=customer", BODY, id="path"),
        pytest.param("POST", "/v1/charges?expand=invoice", BODY, id="query"),
        pytest.param("POST", "/v1/charges", BODY, id="no-query"),
    ],
)
def test_fingerprint_changes_with_request(method: str, target: str, body: object) -> None:
    """A different value, method, path or query gives a different fingerprint."""
    assert _json_fp(body, method=method, target=target) != _json_fp(BODY)


FIELDS = ("amount", "customer.id")


def _fields_fp(body: object) -> str:
    return fingerprint("POST", TARGET, json_body=body, is_json=True, fields=FIELDS)


def test_fingerprint_fields_ignore_other_fields() -> None:
    """With fingerprint_fields, fields outside the projection do not count."""
    other = {
        "amount": 100,
        "currency": "usd",
        "customer": {"id": "cus_1", "email": "b@example.com"},
        "request_id": "r-2",
    }
    assert _fields_fp(other) == _fields_fp(BODY)
    assert _json_fp(other) != _json_fp(BODY)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({**BODY, "amount": 200}, id="top-level"),
        pytest.param({**BODY, "customer": {"id": "cus_2"}}, id="dotted"),
        pytest.param({k: v for k, v in BODY.items() if k != "customer"}, id="missing"),
    ],
)
def test_fingerprint_fields_see_projected_fields(body: object) -> None:
    """With fingerprint_fields, a change to a named (dotted) field changes the fingerprint."""
    assert _fields_fp(body) != _fields_fp(BODY)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([1, 2], id="list"),
        pytest.param("text", id="str"),
        pytest.param(None, id="null"),
    ],
)
def test_fingerprint_fields_need_a_json_object(body: object) -> None:
    """fingerprint_fields on a JSON body that is not an object is refused."""
    with pytest.raises(InvalidRequest) as info:
        fingerprint(
            "POST", TARGET, json_body=body, is_json=True, fields=FIELDS, reference=REFERENCE
        )
    assert info.value.intent == REFERENCE


def test_fingerprint_fields_need_a_json_body() -> None:
    """fingerprint_fields on a non-JSON body is refused."""
    with pytest.raises(InvalidRequest) as info:
        fingerprint(
            "POST", TARGET, raw_body=b"a=1", is_json=False, fields=FIELDS, reference=REFERENCE
        )
    assert info.value.intent == REFERENCE


def test_fingerprint_raw_body_is_hashed_as_bytes() -> None:
    """A non-JSON body counts byte for byte, whitespace included."""

    def raw(body: bytes) -> str:
        return fingerprint("POST", TARGET, raw_body=body, is_json=False)

    assert raw(b"a=1&b=2") == raw(b"a=1&b=2")
    assert raw(b"a=1&b=2") != raw(b"b=2&a=1")
    assert raw(b"a=1") != raw(b"a=1 ")
    assert raw(b"") != raw(b"\x00")


def test_fingerprint_raw_body_ignores_json_body() -> None:
    """A non-JSON request ignores json_body and hashes only raw_body."""
    first = fingerprint("POST", TARGET, json_body={"a": 1}, raw_body=b"x", is_json=False)
    second = fingerprint("POST", TARGET, json_body={"a": 2}, raw_body=b"x", is_json=False)
    assert first == second


def _circular() -> dict[str, object]:
    node: dict[str, object] = {}
    node["self"] = node
    return node


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"tags": {"a", "b"}}, id="set"),
        pytest.param({"amount": float("nan")}, id="nan"),
        pytest.param({"amount": math.inf}, id="inf"),
        pytest.param({"when": object()}, id="object"),
        pytest.param({1: "a", "b": 2}, id="mixed-keys"),
        pytest.param(_circular(), id="circular"),
        pytest.param({"s": "\ud800"}, id="lone-surrogate"),
    ],
)
def test_fingerprint_refuses_unserialisable_json(body: object) -> None:
    """A JSON body that cannot be serialised raises InvalidRequest naming the reference."""
    with pytest.raises(InvalidRequest) as info:
        fingerprint("POST", TARGET, json_body=body, is_json=True, reference=REFERENCE)
    assert info.value.intent == REFERENCE
    assert REFERENCE in str(info.value)


# -- form bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"amount": "100", "currency": "eur"}, {"currency": "eur", "amount": "100"}),
        ({"a": 1, "b": [1, 2], "c": True}, {"c": True, "b": [1, 2], "a": 1}),
        ({"metadata[order_id]": "N1", "amount": 5}, {"amount": 5, "metadata[order_id]": "N1"}),
    ],
)
def test_canonical_form_ignores_field_order(first: dict[str, object], second: object) -> None:
    """Two forms with the same fields in another order canonicalise alike."""
    assert isinstance(second, dict)
    assert canonical_form(first) == canonical_form(second)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"tags": ["a", "b"]}, {"tags": ["b", "a"]}),
        ({"amount": "100"}, {"amount": "101"}),
        ({"flag": True}, {"flag": "True"}),
    ],
)
def test_canonical_form_keeps_what_changes_meaning(
    first: dict[str, object], second: dict[str, object]
) -> None:
    """Repeated values keep their order, and values still count."""
    assert canonical_form(first) != canonical_form(second)


def test_canonical_form_of_a_sorted_form_is_what_httpx_sends() -> None:
    """A form already in name order hashes the bytes it is sent as (old fingerprints hold)."""
    form = {"a": "x y", "b": [1, 2], "c": True, "d": None, "e": "ü&="}
    assert canonical_form(form) == httpx.Request("POST", "http://x/", data=form).read()


@pytest.mark.parametrize(
    ("form", "hint"),
    [
        ({"metadata": {"order_id": "N1"}}, "metadata[order_id]"),
        ({"items": [{"sku": "a"}]}, "items[0]"),
        ({"items": [["a"]]}, "items[0]"),
    ],
)
def test_check_form_refuses_nested_values(form: dict[str, object], hint: str) -> None:
    """A nested dict or list in data= is InvalidRequest with the bracket-name hint."""
    with pytest.raises(InvalidRequest) as info:
        check_form(form, reference=REFERENCE)
    assert hint in info.value.message
    assert info.value.intent == REFERENCE


@pytest.mark.parametrize(
    "form", [{"a": "1"}, {"a": 1.5, "b": None, "c": False}, {"tags": ["a", "b"]}, {"t": ()}]
)
def test_check_form_accepts_flat_forms(form: dict[str, object]) -> None:
    """Scalars and lists of scalars (a repeated field) pass."""
    check_form(form, reference=REFERENCE)
