"""Provider profiles: the built-ins, lookup and validation of custom profiles."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from pydantic import ConfigDict, ValidationError

from postonce._exceptions import ConfigurationError, UnknownProvider
from postonce._keys import check_key, mint_key
from postonce.providers import (
    BUILTIN_PROVIDERS,
    Provider,
    StatusRule,
    get_provider,
    provider_identity,
    same_provider,
)

EXPECTED_NAMES = frozenset(
    {
        "stripe",
        "adyen",
        "checkout",
        "mollie",
        "modern_treasury",
        "increase",
        "lithic",
        "paypal_orders",
        "razorpay_payouts",
        "square",
        "aws_client_token",
        "ietf_draft",
    }
)
BUILTINS = [pytest.param(p, id=name) for name, p in sorted(BUILTIN_PROVIDERS.items())]


def test_builtin_names() -> None:
    """Every documented built-in profile is present."""
    assert set(BUILTIN_PROVIDERS) >= EXPECTED_NAMES


@pytest.mark.parametrize("provider", BUILTINS)
def test_builtin_profile_is_sound(provider: Provider) -> None:
    """A built-in is filed under its name, cites a source and keeps keys for a positive time."""
    assert BUILTIN_PROVIDERS[provider.name] is provider
    assert provider.sources
    assert all(source.strip() for source in provider.sources)
    assert provider.retention > timedelta(0)
    assert provider.key_field


@pytest.mark.parametrize("provider", BUILTINS)
def test_minted_key_passes_every_builtin(provider: Provider) -> None:
    """A freshly minted UUIDv4 is accepted by every built-in profile."""
    for _ in range(20):
        key = mint_key()
        assert check_key(key, provider, reference="r") == key


def test_get_provider_unknown_lists_known_names() -> None:
    """An unknown name raises UnknownProvider (a ConfigurationError) listing the known names."""
    with pytest.raises(UnknownProvider) as info:
        get_provider("nope")
    assert isinstance(info.value, ConfigurationError)
    message = str(info.value)
    assert "'nope'" in message
    for name in BUILTIN_PROVIDERS:
        assert name in message


@pytest.mark.parametrize("name", sorted(EXPECTED_NAMES))
def test_get_provider_by_name(name: str) -> None:
    """A built-in name returns that built-in profile."""
    assert get_provider(name) is BUILTIN_PROVIDERS[name]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("Stripe", "stripe", id="capitalised"),
        pytest.param("STRIPE", "stripe", id="upper"),
        pytest.param("PayPal_Orders", "paypal_orders", id="mixed"),
        pytest.param("AWS_Client_Token", "aws_client_token", id="aws"),
    ],
)
def test_get_provider_ignores_letter_case(name: str, expected: str) -> None:
    """A built-in name in any letter case returns that built-in profile itself."""
    assert get_provider(name) is BUILTIN_PROVIDERS[expected]


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        pytest.param("strpie", "stripe", id="typo"),
        pytest.param("paypal-orders", "paypal_orders", id="dash"),
        pytest.param("Adyn", "adyen", id="case-and-typo"),
    ],
)
def test_get_provider_unknown_suggests_the_closest_name(name: str, suggested: str) -> None:
    """An unknown name close to a built-in one is answered with that name, and the full list."""
    with pytest.raises(UnknownProvider) as info:
        get_provider(name)
    message = str(info.value)
    assert f"did you mean {suggested!r}?" in message
    assert all(known in message for known in BUILTIN_PROVIDERS)


def test_get_provider_unknown_without_a_close_name_suggests_nothing() -> None:
    """A name like no built-in one gets no suggestion, only the list."""
    with pytest.raises(UnknownProvider) as info:
        get_provider("zzzzzzzz")
    assert "did you mean" not in str(info.value)
    assert "known: " in str(info.value)


def test_get_provider_passes_custom_profile_through() -> None:
    """A Provider instance comes back as the very same object."""
    custom = Provider(
        name="stripe",  # even a built-in's name does not swap in the built-in
        key_field="X-Request-Key",
        key_max_length=64,
        retention=timedelta(hours=48),
        in_flight=(StatusRule(status=409),),
        mismatch=(StatusRule(status=422),),
    )
    assert get_provider(custom) is custom
    assert get_provider(custom) is not BUILTIN_PROVIDERS["stripe"]


def test_provider_is_frozen() -> None:
    """Assigning to a Provider field raises."""
    provider = BUILTIN_PROVIDERS["stripe"]
    with pytest.raises(ValidationError):
        provider.retention = timedelta(days=30)  # type: ignore[misc]
    assert provider.retention == timedelta(hours=24)


def test_status_rule_is_frozen() -> None:
    """Assigning to a StatusRule field raises."""
    rule = StatusRule(status=409)
    with pytest.raises(ValidationError):
        rule.status = 410  # type: ignore[misc]


BASE: dict[str, Any] = {"name": "custom", "retention": timedelta(hours=1)}


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"key_min_length": 10, "key_max_length": 5}, id="min-above-max"),
        pytest.param({"key_min_length": 0}, id="zero-min"),
        pytest.param({"key_max_length": 0}, id="zero-max"),
        pytest.param({"retention": timedelta(0)}, id="zero-retention"),
        pytest.param({"retention": timedelta(seconds=-1)}, id="negative-retention"),
        pytest.param({"in_flight": [{}]}, id="empty-in-flight-rule"),
        pytest.param({"mismatch": [{"status": None, "code": None}]}, id="empty-mismatch-rule"),
        pytest.param({"retryable": [{}]}, id="empty-retryable-rule"),
        pytest.param({"indeterminate": [{"link_rel": "describedby"}]}, id="link-rel-only-rule"),
        pytest.param({"key_transport": "query"}, id="unknown-transport"),
        pytest.param({"unknown": 1}, id="unknown-field"),
    ],
)
def test_invalid_provider_rejected(fields: Mapping[str, Any]) -> None:
    """An inconsistent custom profile raises pydantic ValidationError."""
    with pytest.raises(ValidationError):
        Provider.model_validate({**BASE, **fields})


def test_status_rule_needs_status_or_code() -> None:
    """A StatusRule with neither status nor code raises ValidationError."""
    with pytest.raises(ValidationError):
        StatusRule.model_validate({})


def test_bad_key_pattern_rejected() -> None:
    """A key_pattern that is not a valid regular expression raises ValidationError."""
    with pytest.raises(ValidationError):
        Provider.model_validate({**BASE, "key_pattern": "("})


def test_valid_custom_provider() -> None:
    """A consistent custom profile validates with the given values."""
    provider = Provider.model_validate(
        {**BASE, "key_min_length": 36, "key_max_length": 36, "key_pattern": r"[0-9a-f-]+"}
    )
    assert (provider.key_min_length, provider.key_max_length) == (36, 36)
    assert provider.key_pattern == r"[0-9a-f-]+"


_STRIPE = BUILTIN_PROVIDERS["stripe"]


@pytest.mark.parametrize(
    ("provider", "expected"),
    [
        pytest.param(_STRIPE, "stripe", id="builtin-unchanged"),
        pytest.param(
            _STRIPE.model_copy(update={"in_flight": ()}), "stripe", id="builtin-rules-changed"
        ),
        pytest.param(
            _STRIPE.model_copy(update={"key_field": "idempotency-key"}),
            "stripe",
            id="builtin-header-case",
        ),
        pytest.param(
            _STRIPE.model_copy(update={"key_field": "X-Key"}), "stripe#", id="builtin-key-moved"
        ),
        pytest.param(
            _STRIPE.model_copy(update={"retention": timedelta(days=7)}),
            "stripe#",
            id="builtin-retention-changed",
        ),
        pytest.param(
            Provider(name="ledger", retention=timedelta(hours=48)), "ledger#", id="custom"
        ),
    ],
)
def test_provider_identity(provider: Provider, expected: str) -> None:
    """A built-in with its key facts is its plain name; anything else is name#digest of them."""
    identity = provider_identity(provider)
    if expected.endswith("#"):
        assert identity.startswith(expected)
        assert len(identity) == len(expected) + 12
    else:
        assert identity == expected


def test_provider_identity_follows_facts_not_objects() -> None:
    """Two equal custom profiles share an identity; moving the key or the retention changes it."""
    one = Provider(name="ledger", key_field="X-Key", retention=timedelta(hours=48))
    same = Provider(name="ledger", key_field="X-Key", retention=timedelta(hours=48))
    assert provider_identity(one) == provider_identity(same)
    moved = one.model_copy(update={"key_transport": "body"})
    longer = one.model_copy(update={"retention": timedelta(hours=72)})
    identities = {provider_identity(p) for p in (one, moved, longer)}
    assert len(identities) == 3
    # Asked again (each profile's identity is kept after its first use): the same answers.
    assert {provider_identity(p) for p in (longer, moved, one)} == identities


@pytest.mark.parametrize(
    ("stored", "identity", "expected"),
    [
        pytest.param("stripe", "stripe", True, id="same-builtin"),
        pytest.param("stripe", "paypal_orders", False, id="other-builtin"),
        pytest.param("stripe", "stripe#0123456789ab", False, id="builtin-vs-modified"),
        pytest.param("ledger#0123456789ab", "ledger#0123456789ab", True, id="same-custom"),
        pytest.param("ledger#0123456789ab", "ledger#ba9876543210", False, id="custom-changed"),
        pytest.param("ledger", "ledger#0123456789ab", True, id="legacy-bare-custom"),
        pytest.param("ledger", "other#0123456789ab", False, id="legacy-other-name"),
    ],
)
def test_same_provider(stored: str, identity: str, expected: bool) -> None:
    """An intent resumes only under its own provider; a bare pre-digest custom name still does."""
    assert same_provider(stored, identity) is expected


def test_provider_identity_of_a_thawed_subclass_follows_its_facts() -> None:
    """Only ``Provider`` itself (frozen) has its identity kept; a subclass that thaws its
    model and moves its key gets a new identity, so a pending intent is not resumed under it."""

    class Thawed(Provider):
        model_config = ConfigDict(frozen=False, extra="forbid")

    profile = Thawed(name="ledger", key_field="X-Key", retention=timedelta(hours=48))
    before = provider_identity(profile)
    profile.key_field = "X-Other-Key"
    assert provider_identity(profile) != before


def test_aws_retries_botocore_standard_mode_codes() -> None:
    """aws_client_token retries (same token) every code botocore's standard mode retries."""
    from tests.test_classify import AWS_RETRYABLE

    profile = BUILTIN_PROVIDERS["aws_client_token"]
    assert {rule.code for rule in profile.retryable} == set(AWS_RETRYABLE)
    assert all(rule.status is None for rule in profile.retryable)  # whatever the status
    assert any("botocore" in source for source in profile.sources)


def test_ietf_draft_knows_both_key_reuse_shapes() -> None:
    """ietf_draft's key reuse is a 422 as problem+json or with a Link rel="describedby"."""
    rules = BUILTIN_PROVIDERS["ietf_draft"].mismatch
    assert StatusRule(status=422, content_type="application/problem+json") in rules
    assert StatusRule(status=422, link_rel="describedby") in rules


def test_custom_profile_takes_retryable_and_indeterminate_rules() -> None:
    """A custom profile names answers to retry and answers that leave the outcome unknown."""
    provider = Provider.model_validate(
        {
            **BASE,
            "retryable": [{"status": 400, "code": "locked"}],
            "indeterminate": [{"status": 500, "code": "outcome_unknown"}],
        }
    )
    assert provider.retryable == (StatusRule(status=400, code="locked"),)
    assert provider.indeterminate == (StatusRule(status=500, code="outcome_unknown"),)
    assert Provider.model_validate(BASE).retryable == ()
    assert Provider.model_validate(BASE).indeterminate == ()
