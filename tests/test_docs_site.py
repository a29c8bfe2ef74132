"""The documentation site cannot drift: generated pages cover the code, the nav resolves.

These tests import the gen-files scripts under docs/ and read mkdocs.yml as text; they
need neither mkdocs nor PyYAML (CI builds the site separately, with --strict).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

import postonce
from postonce import BUILTIN_PROVIDERS, Provider, RetryPolicy, StatusRule
from postonce._policy import horizon_at

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"


def load_script(name: str) -> ModuleType:
    """Import docs/<name>.py, a gen-files script, as a module."""
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the body runs
    spec.loader.exec_module(module)
    return module


gen_providers = load_script("gen_providers")
gen_exceptions = load_script("gen_exceptions")


def nav_entries() -> list[str]:
    """Every page named in mkdocs.yml's nav, commented-out lines left out."""
    text = MKDOCS_YML.read_text()
    nav = text.split("\nnav:\n", 1)[1]
    entries = []
    for line in nav.splitlines():
        if line and not line.startswith((" ", "-", "#")):
            break  # the next top-level key: the nav is over
        item = line.strip()
        if item.startswith("#"):
            continue
        match = re.fullmatch(r"-\s+(?:[^:]+:\s+)?(\S+\.md)", item)
        if match:
            entries.append(match.group(1))
    return entries


def generated_pages() -> set[str]:
    return {*gen_providers.pages(), gen_exceptions.PAGE_PATH}


@pytest.mark.parametrize("name", sorted(BUILTIN_PROVIDERS))
def test_every_builtin_profile_has_a_generated_page(name: str) -> None:
    """Each built-in profile gets a page with its key's carrier, limits, retention and sources."""
    provider = BUILTIN_PROVIDERS[name]
    pages: dict[str, str] = gen_providers.pages()
    path: str = gen_providers.page_path(provider)
    assert path == f"providers/{name}.md"
    assert path in pages
    page = pages[path]
    assert page == gen_providers.render(provider)
    carrier = "request header" if provider.key_transport == "header" else "JSON body"
    assert f"{carrier} `{provider.key_field}`" in page or (
        f"`{provider.key_field}` of the {carrier}" in page
    )
    assert f"{provider.key_min_length} to {provider.key_max_length} characters" in page
    retention = gen_providers.duration(provider.retention.total_seconds())
    horizon = gen_providers.duration(horizon_at(0.0, provider, RetryPolicy()))
    assert f"at least | {retention}" in page
    assert f"| {horizon} after the first send" in page
    assert provider.sources
    for source in provider.sources:
        assert source in page
    assert f"[`{name}`]({name}.md)" in pages[gen_providers.INDEX_PATH]


def test_answer_table_is_read_through_the_classifier() -> None:
    """The Stripe page says what the classifier does: 409 waits, idempotency_error refuses."""
    page: str = gen_providers.render(BUILTIN_PROVIDERS["stripe"])
    assert "| `409` | **in flight**" in page
    assert "| `400` with the error code `idempotency_error` in the body | **key reused" in page
    assert "| `429`, `502`, `503`, `504` | **retryable**" in page
    assert "| `500` | **retryable**" in page
    assert "| `500` with `Idempotent-Replayed: true` | **indeterminate**" in page
    assert 'a 5xx (`server_errors="replayed"`)' in page
    assert "`Stripe-Should-Retry: true` | **retryable**" in page


def test_a_custom_profile_renders_from_its_own_facts() -> None:
    """render() works for any Provider, not only the built-ins, and shows its horizon."""
    ledger = Provider(
        name="ledger",
        key_transport="body",
        key_field="request_key",
        key_max_length=64,
        key_pattern=r"[a-z0-9-]+",
        retention=timedelta(hours=48),
        mismatch=(StatusRule(status=422),),
    )
    page: str = gen_providers.render(ledger, RetryPolicy(horizon_margin=0.25))
    assert "field `request_key` of the JSON body" in page
    assert "`[a-z0-9-]+`" in page
    assert "| 48 hours |" in page
    assert "| 36 hours after the first send" in page
    assert "| `422` | **key reused" in page
    assert "None recorded in the profile." in page


def test_every_nav_entry_exists_or_is_generated() -> None:
    """Each page in mkdocs.yml's nav is a file under docs/ or a page the scripts generate."""
    entries = nav_entries()
    assert "index.md" in entries
    assert len(entries) == len(set(entries)), "a page is listed twice in the nav"
    generated = generated_pages()
    missing = [e for e in entries if not (DOCS / e).is_file() and e not in generated]
    assert not missing, f"nav names pages that do not exist: {missing}"


def test_every_generated_page_is_in_the_nav() -> None:
    """A new built-in profile (or exceptions page) fails here until mkdocs.yml lists it."""
    absent = sorted(generated_pages() - set(nav_entries()))
    assert not absent, f"generated pages missing from the nav in mkdocs.yml: {absent}"


def test_generated_pages_are_not_also_written_by_hand() -> None:
    """A hand-written file would be shadowed by (or shadow) the generated page."""
    clashes = sorted(p for p in generated_pages() if (DOCS / p).exists())
    assert not clashes, clashes


def test_mkdocs_runs_the_generators_tested_here() -> None:
    """mkdocs.yml runs exactly the gen-files scripts whose output these tests check."""
    text = MKDOCS_YML.read_text()
    for script in ("docs/gen_providers.py", "docs/gen_exceptions.py"):
        assert f"- {script}" in text


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name in postonce.__all__ is rendered: exceptions on their page, the rest in api.md."""
    api = (DOCS / "reference" / "api.md").read_text()
    exceptions = {cls.__name__ for cls in gen_exceptions.classes()}
    for name in postonce.__all__:
        if name == "__version__":
            assert "`postonce.__version__`" in api
        elif name in exceptions:
            assert f"::: postonce.{name}" in gen_exceptions.render(), name
        else:
            assert re.search(rf"^::: postonce\.{name}$", api, re.MULTILINE), name


def test_exception_page_draws_every_exception() -> None:
    """The generated exception tree names every exception postonce exports."""
    from postonce import _exceptions

    tree: str = gen_exceptions.tree()
    for name in _exceptions.__all__:
        assert re.search(rf"\b{name}\b", tree), name
