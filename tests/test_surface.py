"""The names a user needs are importable from ``postonce``; optional parts say what they need."""

from __future__ import annotations

import subprocess
import sys

import pytest

import postonce
from postonce._outbox.postgres import PostgresStore


def test_postgres_store_is_importable_from_postonce() -> None:
    """``from postonce import PostgresStore``: the store the hosts guide builds by hand."""
    from postonce import PostgresStore as exported

    assert exported is PostgresStore


def test_without_psycopg_postgres_store_names_the_extra_and_the_rest_imports() -> None:
    """Without psycopg, ``import postonce`` and ``import *`` work; PostgresStore says why not."""
    script = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import postonce\n"
        "from postonce import *\n"
        "try:\n"
        "    postonce.PostgresStore\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert "pip install 'postonce[postgres]'" in out


def test_an_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        getattr(postonce, "NoSuchThing")  # noqa: B009


#: The layers, top first (docs/architecture.md): a module may import only from its own
#: layer or the ones above it.
LAYERS = [
    {
        "_intent",
        "_classify",
        "_engine",
        "_policy",
        "_keys",
        "_diff",
        "_budget",
        "providers",
        "_notify",
    },
    {"_flow", "_settle"},
    {"_outbox"},
    {"_client", "_async_client", "_drain", "_base", "_appdb", "_receive"},
]


def _imports_of(module: str) -> set[str]:
    """The postonce modules ``module`` imports (first part of the name after ``postonce.``)."""
    import ast
    from pathlib import Path

    path = Path(postonce.__file__).parent / f"{module}.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("layer", "module"),
    [(n, m) for n, layer in enumerate(LAYERS) for m in sorted(layer) if m != "_outbox"],
)
def test_a_module_imports_nothing_from_a_layer_below_it(layer: int, module: str) -> None:
    """Pure decisions import no flow, store or shell; the flow imports no store."""
    below = set().union(*LAYERS[layer + 1 :])
    assert not _imports_of(module) & below
