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
