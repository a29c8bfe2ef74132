"""Griffe extensions that make postonce's source docstrings read well on the API pages.

Loaded by the mkdocstrings handler (``extensions`` in mkdocs.yml); never imported by
postonce itself.

* ``SphinxRoles``: the source docstrings say :class:`Provider` or
  :meth:`postonce.Client.drain`, as Sphinx would; mkdocstrings reads Markdown. Each
  role becomes an autorefs link (``[Provider][postonce.Provider]``) when the target is
  public, plain code otherwise, so every link resolves.
* ``CommentDocstrings``: postonce documents fields and enum members with comments
  (``#: ...`` above, or ``# ...`` at the end of the line). An attribute without a
  docstring gets that comment as its docstring.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|mod|obj|data):`~?([\w.]+)`")
_TRAILING = re.compile(r"#\s*(?P<text>[^#].*?)\s*$")


def _public_target(name: str) -> str | None:
    """The documented identifier a role points at, or None when it is not documented."""
    import postonce  # the package is on the path: mkdocstrings' `paths: [src]`

    dotted = name if name.startswith("postonce.") else f"postonce.{name}"
    parts = dotted.split(".")[1:]
    if not parts or parts[0] not in postonce.__all__:
        return None
    obj: Any = postonce
    for part in parts:
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return dotted


def rewrite_roles(text: str) -> str:
    """Replace every Sphinx role in ``text`` with a Markdown cross-reference or code."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        shown = name.removeprefix("postonce.")
        target = _public_target(name)
        return f"[`{shown}`][{target}]" if target else f"`{shown}`"

    return _ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring Griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite_roles(obj.docstring.value)


def comment_for(lines: list[str], lineno: int, endlineno: int) -> str | None:
    """The comment documenting the statement on lines ``lineno``..``endlineno`` (1-based).

    ``#:`` lines directly above it win; else a comment ending its last line.
    """
    above: list[str] = []
    n = lineno - 2
    while n >= 0 and lines[n].strip().startswith("#:"):
        above.insert(0, lines[n].strip()[2:].strip())
        n -= 1
    if above:
        return " ".join(above)
    last = lines[endlineno - 1]
    if "#" in last:
        code, _, _ = last.partition("#")
        if code.count('"') % 2 == 0 and code.count("'") % 2 == 0:  # not inside a string
            match = _TRAILING.search("#" + last.partition("#")[2])
            if match and not match.group("text").startswith(("type:", "noqa")):
                return match.group("text")
    return None


class CommentDocstrings(griffe.Extension):
    """Give an undocumented attribute the comment written beside it in the source."""

    def __init__(self) -> None:
        self._sources: dict[Path, list[str]] = {}

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        path = attr.filepath
        if isinstance(path, list) or path.suffix != ".py":
            return
        if path not in self._sources:
            self._sources[path] = path.read_text().splitlines()
        text = comment_for(self._sources[path], attr.lineno, attr.endlineno or attr.lineno)
        if text:
            attr.docstring = griffe.Docstring(
                text, lineno=attr.lineno, endlineno=attr.endlineno, parent=attr
            )
