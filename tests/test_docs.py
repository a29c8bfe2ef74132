"""The README and the docs say what is true: their examples run, the API they name exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import postonce

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def python_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text())


def run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("POSTONCE_OUTBOX", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        "docs/index.md",
        "docs/drain.md",
        "docs/dual-write.md",
        "docs/async.md",
        "docs/hosts.md",
        "docs/senders.md",
        "docs/tutorial.md",
        "docs/stripe.md",
        "docs/adyen.md",
        "docs/custom-provider.md",
        "docs/observability.md",
        "docs/testing.md",
        "docs/httpx2.md",
        "docs/retry-budget.md",
    ],
)
def test_every_python_example_runs(doc: str, tmp_path: Path) -> None:
    """Each python block in the docs runs as written, on the default SQLite outbox."""
    blocks = python_blocks(ROOT / doc)
    assert blocks, f"{doc} has no python examples to check"
    for code in blocks:
        result = run_python(code, tmp_path)
        assert result.returncode == 0, f"{doc} example failed:\n{code}\n{result.stderr}"


def test_readme_example_charges_once(tmp_path: Path) -> None:
    """The README's usage example prints a 200, a key and exactly one charge."""
    (code,) = [b for b in python_blocks(ROOT / "README.md") if "post_once" in b]
    result = run_python(code, tmp_path)
    status, key, charges = result.stdout.split()
    assert (status, charges) == ("200", "1")
    assert len(key) == 36
    assert (tmp_path / "data" / "postonce" / "outbox.sqlite3").exists()


def test_quickstart_loses_an_answer_and_charges_once(tmp_path: Path) -> None:
    """examples/quickstart.py retries a lost answer with the same key; the server charges once."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data")}
    env.pop("POSTONCE_OUTBOX", None)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ambiguous" in result.stdout
    assert "replayed by the server: True" in result.stdout
    assert "answered from the outbox: True" in result.stdout
    assert "the server charged 1 time(s)" in result.stdout


def test_readme_set_up_has_exactly_two_commands() -> None:
    """The README's set-up is two commands: the quickstart, and the tests."""
    section = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert commands == [
        "pip install . && python examples/quickstart.py",
        'pip install -e ".[test]" && pytest',
    ]
    assert 'pip install -e ".[test]"' in (ROOT / ".ci" / "run").read_text()


def test_public_names_are_exported_and_documented() -> None:
    """__all__ lists exactly the public names of postonce, each with a docstring."""
    public = {name for name in dir(postonce) if not name.startswith("_")}
    modules = {"providers", "testing", "otel"}
    assert set(postonce.__all__) - {"__version__"} == public - modules
    for name in postonce.__all__:
        obj = getattr(postonce, name)
        if callable(obj):
            assert obj.__doc__, f"postonce.{name} has no docstring"


def test_exception_tree_is_drawn_in_its_module() -> None:
    """Every exception class appears in the tree in _exceptions' docstring."""
    from postonce import _exceptions

    doc = _exceptions.__doc__ or ""
    for name in _exceptions.__all__:
        assert name in doc, name
        assert issubclass(getattr(_exceptions, name), postonce.PostonceError)


def test_bad_input_table_names_only_tests_that_exist() -> None:
    """Every row of docs/bad-input.md points at a test (and parameter id) in the suite."""
    table = (ROOT / "docs" / "bad-input.md").read_text()
    refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([\w-]+)\])?`", table)
    assert len(refs) >= 30
    for path, name, param in refs:
        source = (ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{path}::{name} is missing"
        if param:
            assert f'id="{param}"' in source, f"{path}::{name}[{param}] is missing"


def test_every_example_is_named_on_the_page_it_illustrates() -> None:
    """Each examples/*.py is pointed at from a documentation page, by its path."""
    pages = "\n".join(p.read_text() for p in (ROOT / "docs").rglob("*.md"))
    for example in sorted((ROOT / "examples").glob("*.py")):
        if example.name == "__init__.py":
            continue
        assert f"examples/{example.name}" in pages, f"no docs page names {example.name}"
