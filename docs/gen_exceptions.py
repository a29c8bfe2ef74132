"""Generate reference/exceptions.md from the exception classes themselves.

Run by the mkdocs-gen-files plugin (see mkdocs.yml). The tree is walked from
``postonce.PostonceError`` through ``__subclasses__()``, the one-line meanings are
the first lines of the docstrings, and the attributes each error carries are read
from its constructor, so the page cannot drift from the code. ``render()`` is
importable for tests; nothing here imports mkdocs unless run as a gen-files script.
"""

from __future__ import annotations

import inspect

import postonce

__all__ = ["PAGE_PATH", "classes", "main", "render", "tree"]

PAGE_PATH = "reference/exceptions.md"


def _children(cls: type[BaseException]) -> list[type[BaseException]]:
    return [c for c in cls.__subclasses__() if c.__module__.startswith("postonce.")]


def classes() -> list[type[BaseException]]:
    """Every exception class postonce defines, root first, depth first."""
    out: list[type[BaseException]] = []

    def walk(cls: type[BaseException]) -> None:
        out.append(cls)
        for child in _children(cls):
            walk(child)

    walk(postonce.PostonceError)
    return out


def _summary(cls: type[BaseException]) -> str:
    return (inspect.getdoc(cls) or "").split("\n", 1)[0].strip()


def tree() -> str:
    """The hierarchy as box-drawing lines, each with the class's one-line meaning."""
    rows: list[tuple[str, str]] = []

    def walk(cls: type[BaseException], prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└── " if last else "├── ")
        rows.append((prefix + branch + cls.__name__, _summary(cls)))
        children = _children(cls)
        inner = "" if root else prefix + ("    " if last else "│   ")
        for i, child in enumerate(children):
            walk(child, inner, i == len(children) - 1, False)

    walk(postonce.PostonceError, "", True, True)
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join(f"{name:<{width}}{text}".rstrip() for name, text in rows)


def _carries(cls: type[BaseException]) -> list[str]:
    params = inspect.signature(cls.__init__).parameters
    return [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY]


def _public_name(cls: type[BaseException]) -> str:
    name = cls.__name__
    return f"postonce.{name}" if getattr(postonce, name, None) is cls else cls.__module__


def render() -> str:
    """The exceptions reference page, as Markdown."""
    out = [
        "# Exceptions",
        "",
        "Every error postonce raises derives from `PostonceError`. This page is generated "
        "from the classes, so it lists exactly what the code defines. Errors raised while "
        "handling an intent name its reference and, once a key exists, its key "
        "(`exc.reference`, `exc.key`, and both in the message). Answers such as a 402 or "
        "a replayed 500 are not errors: they come back as the `httpx.Response`.",
        "",
        "```text",
        tree(),
        "```",
        "",
        "| exception | derives from | carries |",
        "| --- | --- | --- |",
    ]
    for cls in classes():
        base = next((b for b in cls.__bases__ if issubclass(b, BaseException)), Exception)
        carries = ", ".join(f"`{n}`" for n in ["message", *_carries(cls)])
        out.append(f"| [`{cls.__name__}`][{_public_name(cls)}] | `{base.__name__}` | {carries} |")
    out += [
        "",
        "Catch `postonce.IntentError` for everything that happened to one stored intent, "
        "`postonce.PostonceError` for anything postonce raises. "
        "See [reconciling expired intents](../reconcile.md) for what to do with "
        "`IntentExpired`.",
        "",
        "## Classes",
        "",
    ]
    for cls in classes():
        out += [
            f"::: {_public_name(cls)}",
            "    options:",
            "      show_bases: true",
            "      members: false",
            "      inherited_members: false",
            "",
        ]
    return "\n".join(out)


def main() -> None:
    """Write the page into the site being built (mkdocs-gen-files)."""
    import mkdocs_gen_files

    with mkdocs_gen_files.open(PAGE_PATH, "w") as page:
        page.write(render())


if __name__ in {"__main__", "<run_path>"}:
    main()
