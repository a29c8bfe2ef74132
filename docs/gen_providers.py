"""Generate the provider contract pages from ``postonce.providers.BUILTIN_PROVIDERS``.

Run by the mkdocs-gen-files plugin (see mkdocs.yml): one page per built-in profile
under ``providers/``, and ``providers/index.md`` listing them all. Every fact on a
page is read from the ``Provider`` object, and every "what postonce does" is asked of
postonce's own classifier and horizon function, so the pages cannot disagree with the
code. The notes beside each profile in ``providers.py`` (the comments inside its
``Provider(...)`` call) are quoted too.

``render(provider)`` and ``page_path(provider)`` are importable: tests/test_docs_site.py
calls them. Nothing here imports mkdocs unless the module runs as a gen-files script.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import postonce.providers
from postonce import RetryPolicy
from postonce._classify import classify_response
from postonce._intent import Outcome
from postonce._keys import check_key, mint_key
from postonce._policy import horizon_at
from postonce.providers import BUILTIN_PROVIDERS, Provider, StatusRule

__all__ = ["INDEX_PATH", "main", "page_path", "pages", "profile_notes", "render", "render_index"]

INDEX_PATH = "providers/index.md"

#: What postonce does with each outcome of an attempt.
ACTIONS: Mapping[Outcome, str] = {
    Outcome.IN_PROGRESS: (
        "**in flight**: wait briefly, then send the same key again; never a failure, "
        "and not counted against `RetryPolicy.attempts`"
    ),
    Outcome.MISMATCH: (
        "**key reused with another request**: the answer is stored, "
        "`IdempotencyKeyMismatch` is raised, and the intent is never retried"
    ),
    Outcome.RETRYABLE: (
        "**retryable**: send the same key again after `Retry-After` "
        "(capped at `RetryPolicy.retry_after_max`) or a jittered backoff"
    ),
    Outcome.INDETERMINATE: (
        "**indeterminate**: the effect is unknown; the answer is stored, not retried and not "
        "called a failure: `IntentIndeterminate` is raised and the intent stays `indeterminate` "
        "until your reconciler or an operator resolves it"
    ),
    Outcome.FINAL: (
        "**final answer**: stored and returned as the `httpx.Response`, not retried; "
        "the intent is `succeeded` for a 2xx, else `failed`"
    ),
}

#: The summary's groups, in the order a page lists them: (outcome, heading, what happens).
GROUPS: tuple[tuple[Outcome, str, str], ...] = (
    (Outcome.FINAL, "Final", "stored and returned as the `httpx.Response`; never retried"),
    (
        Outcome.RETRYABLE,
        "Retried (same key)",
        "sent again with the same key after `Retry-After` or a backoff, until the horizon",
    ),
    (
        Outcome.IN_PROGRESS,
        "In flight",
        "an earlier request with the key is still running: waited on, then the same key again",
    ),
    (
        Outcome.INDETERMINATE,
        "Indeterminate (reconciled)",
        "the effect is unknown: never retried, never called failed; `IntentIndeterminate`, "
        "then [reconciled](../reconcile.md)",
    ),
    (
        Outcome.MISMATCH,
        "Key reuse (mismatch)",
        "the key was used with another request: `IdempotencyKeyMismatch`, never retried",
    ),
)

#: The profile fields whose source notes belong to each group of the summary.
_GROUP_FIELDS: Mapping[Outcome, tuple[str, ...]] = {
    Outcome.FINAL: (),
    Outcome.RETRYABLE: ("retryable", "retryable_statuses"),
    Outcome.IN_PROGRESS: ("in_flight",),
    Outcome.INDETERMINATE: ("indeterminate",),
    Outcome.MISMATCH: ("mismatch",),
}

#: The key shown in examples (postonce mints a fresh UUIDv4 per intent).
EXAMPLE_KEY = "8e03978e-40d5-43e8-bc93-6894a57f9324"
#: Profile fields whose source note is shown beside the value rather than in the notes.
_INLINE_NOTES = frozenset(
    {"retention", "server_errors", "mismatch", "in_flight", "retryable", "indeterminate"}
)

#: What each 5xx rule (``Provider.server_errors``) says, and what postonce does with it.
SERVER_ERRORS: Mapping[str, str] = {
    "retry": "the provider says to retry a 5xx with the same key: **retryable**",
    "not_stored": (
        "the provider stores only successes, so a 5xx leaves nothing behind the key and "
        "the same key is executed again: **retryable**"
    ),
    "replayed": (
        "the provider stores a 5xx produced while executing and replays it: **retryable** "
        "(the first 5xx may be a proxy's, or its result indeterminate) until an answer "
        "carries the replay marker; that one is the answer stored for the key, and it does "
        "not say whether the request took effect: **indeterminate**"
    ),
    "hint": (
        "the provider says to retry only when its retry hint header says `true`: a 5xx "
        "without it is not retried, and does not say whether the request took effect: "
        "**indeterminate**"
    ),
    "undocumented": (
        "not documented: **retryable**, the safe reading (the same key again can only be "
        "deduplicated or answered alike; a 5xx handed to the caller invites a retry with "
        "a new key, and a second charge)"
    ),
}

_SUCCESS = "`2xx`"
_DASH = "\u2014"
_SUCCESS_ACTION = (
    "**success**: stored and returned as the `httpx.Response`; the intent is `succeeded`"
)
_UNIVERSAL_CHARSET = "printable ASCII without quotes, backslashes, spaces or control characters"


# -- the profile's own notes ------------------------------------------------------------


@dataclass
class Notes:
    """The comments inside one ``Provider(...)`` call in providers.py."""

    general: list[str] = field(default_factory=list)  # comments before the first argument
    fields: dict[str, str] = field(default_factory=dict)  # trailing comment of an argument


def profile_notes(name: str) -> Notes:
    """The comments beside the built-in profile ``name`` in providers.py (empty if none)."""
    return _all_notes().get(name, Notes())


_NOTES_CACHE: dict[str, Notes] = {}


def _all_notes() -> dict[str, Notes]:
    if _NOTES_CACHE:
        return _NOTES_CACHE
    try:
        source = inspect.getsource(postonce.providers)
    except (OSError, TypeError):  # no source shipped: the pages go without notes
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Provider"):
            continue
        names = [k for k in node.keywords if k.arg == "name"]
        if not names or not isinstance(names[0].value, ast.Constant):
            continue
        notes = Notes()
        first = min(k.lineno for k in node.keywords)
        for line in range(node.lineno, first):
            if line in comments:
                notes.general.append(comments[line])
        for keyword in node.keywords:
            end = keyword.value.end_lineno or keyword.lineno
            said = [comments[n] for n in range(keyword.lineno, end + 1) if n in comments]
            if said and keyword.arg is not None:
                notes.fields[keyword.arg] = "; ".join(said)
        _NOTES_CACHE[str(names[0].value.value)] = notes
    return _NOTES_CACHE


# -- formatting ---------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """``86400`` -> ``24 hours``; ``77760`` -> ``21 hours 36 minutes``."""
    seconds = round(seconds)
    if seconds % 86400 == 0 and seconds >= 7 * 86400:
        return _plural(seconds // 86400, "day")
    parts = []
    days, rest = divmod(seconds, 86400)
    if days and seconds >= 3 * 86400:
        parts.append(_plural(days, "day"))
    else:
        rest = seconds
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        parts.append(_plural(hours, "hour"))
    if minutes:
        parts.append(_plural(minutes, "minute"))
    if secs or not parts:
        parts.append(_plural(secs, "second"))
    return " ".join(parts)


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _code(values: Iterable[object]) -> str:
    return ", ".join(f"`{v}`" for v in values)


def _source(source: str) -> str:
    if source.startswith(("https://", "http://")):
        return f"<{source}>"
    return source


def page_path(provider: Provider) -> str:
    """Where the page of ``provider`` lives in the site, relative to docs/."""
    return f"providers/{provider.name}.md"


def horizon(provider: Provider, policy: RetryPolicy | None = None) -> timedelta:
    """postonce's retry horizon under ``provider``: its retention less the policy's margin."""
    policy = policy if policy is not None else RetryPolicy()
    return timedelta(seconds=horizon_at(0.0, provider, policy))


# -- answers ------------------------------------------------------------------------------


def _body(code: str | None) -> bytes:
    return json.dumps({"code": code} if code is not None else {}).encode()


def _shape(rule: StatusRule) -> str:
    status = f"`{rule.status}`" if rule.status is not None else "any 4xx or 5xx"
    if rule.content_type is not None:
        status += f" as `{rule.content_type}`"
    if rule.link_rel is not None:
        status += f' with a `Link: <...>; rel="{rule.link_rel}"` header'
    return status


def _rule_label(rule: StatusRule, shadowed: bool) -> str:
    status = _shape(rule)
    if rule.code is not None:
        return f"{status} with the error code `{rule.code}` in the body"
    plain = rule.content_type is None and rule.link_rel is None
    return f"{status} (any other body)" if shadowed and plain else status


def _rules_label(rules: Iterable[StatusRule], shadowed: bool) -> str:
    """One label for rules that differ only by code: ``... with an error code `A`, `B` ...``."""
    rules = list(rules)
    if len(rules) == 1 or any(r.code is None for r in rules):
        return "; ".join(_rule_label(r, shadowed) for r in rules)
    return f"{_shape(rules[0])} with one of the error codes {_code(r.code for r in rules)}"


def _probe(
    rule: StatusRule, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """An answer that ``rule`` matches: its status (400 if any), media type, Link and code."""
    status = rule.status if rule.status is not None else 400
    extra = dict(headers or {})
    if rule.content_type is not None:
        extra["content-type"] = rule.content_type
    if rule.link_rel is not None:
        extra["link"] = f'<https://example.com/errors>; rel="{rule.link_rel}"'
    return status, extra, _body(rule.code)


def _grouped(rules: Iterable[StatusRule]) -> list[list[StatusRule]]:
    """Rules gathered by everything but their code, in their order."""
    groups: dict[tuple[int | None, str | None, str | None, bool], list[StatusRule]] = {}
    for rule in rules:
        key = (rule.status, rule.content_type, rule.link_rel, rule.code is None)
        groups.setdefault(key, []).append(rule)
    return list(groups.values())


def answer_rows(provider: Provider) -> list[tuple[str, Outcome]]:
    """Each answer the profile singles out, and the outcome postonce's classifier gives it."""
    rows: list[tuple[str, Outcome]] = [(_SUCCESS, classify_response(200, {}, b"{}", provider))]
    coded: set[int | None] = set()
    singled = (
        *provider.mismatch,
        *provider.in_flight,
        *provider.indeterminate,
        *provider.retryable,
    )
    for kind in (provider.mismatch, provider.in_flight, provider.indeterminate, provider.retryable):
        for group in _grouped(kind):
            outcome = classify_response(*_probe(group[0]), provider)
            rows.append((_rules_label(group, shadowed=group[0].status in coded), outcome))
            for rule in group:
                if rule.code is not None or rule.content_type is not None or rule.link_rel:
                    coded.add(rule.status)
    plain = {
        r.status
        for r in singled
        if r.code is None and r.content_type is None and r.link_rel is None
    }
    for status in (400, 409, 422):
        if status not in plain:
            other = status in coded or None in coded
            label = f"any other `{status}`" if other else f"`{status}`"
            rows.append((label, classify_response(status, {}, _body(None), provider)))
    by_outcome: dict[Outcome, list[int]] = {}
    for status in sorted(provider.retryable_statuses):
        by_outcome.setdefault(classify_response(status, {}, _body(None), provider), []).append(
            status
        )
    for outcome, statuses in by_outcome.items():
        rows.append((_code(statuses), outcome))
    if 500 not in plain and 500 not in provider.retryable_statuses:
        label = "any other `500`" if 500 in coded or None in coded else "`500`"
        rows.append((label, classify_response(500, {}, _body(None), provider)))
        if provider.server_errors == "replayed" and provider.replay_headers:
            marked = {provider.replay_headers[0]: "true"}
            rows.append(
                (
                    f"`500` with `{provider.replay_headers[0]}: true`",
                    classify_response(500, marked, _body(None), provider),
                )
            )
    return rows


def _hint_rows(provider: Provider) -> list[tuple[str, Outcome]]:
    name = provider.retry_hint_header
    if name is None:
        return []
    probe = 418  # an error status no profile singles out
    rows = [
        (
            f"another 4xx or 5xx with `{name}: true`",
            classify_response(probe, {name: "true"}, _body(None), provider),
        ),
        (
            f"another 4xx with `{name}: false`",
            classify_response(probe, {name: "false"}, _body(None), provider),
        ),
        (
            f"a 5xx with `{name}: false`",
            classify_response(599, {name: "false"}, _body(None), provider),
        ),
    ]
    for rule in provider.in_flight[:1]:  # the hint outranks every in-flight rule alike
        status, headers, body = _probe(rule, {name: "false"})
        label = f"an in-flight answer ({_rule_label(rule, False)}) with `{name}: false`"
        seen = classify_response(status, headers, body, provider, key_seen=True)
        fresh = classify_response(status, headers, body, provider, key_seen=False)
        rows.append((f"{label}, after an attempt with the key may have reached the server", seen))
        rows.append((f"{label}, to the first send of a fresh key", fresh))
    return rows


def summary(provider: Provider, notes: Notes | None = None) -> list[str]:
    """The page's answers gathered by what postonce does with them, with the profile's notes."""
    notes = notes if notes is not None else Notes()
    by_outcome: dict[Outcome, list[str]] = {}
    for label, outcome in (*answer_rows(provider), *_hint_rows(provider)):
        by_outcome.setdefault(outcome, []).append(label)
    out = [
        "| what postonce does | answers under this profile | the profile's notes |",
        "| --- | --- | --- |",
    ]
    for outcome, heading, action in GROUPS:
        labels = by_outcome.get(outcome, [])
        said = [
            f"`{name}`: {notes.fields[name]}"
            for name in _GROUP_FIELDS[outcome]
            if name in notes.fields
        ]
        answers = "; ".join(labels) or "none"
        out.append(f"| **{heading}**: {action} | {answers} | {'; '.join(said) or _DASH} |")
    return out


# -- pages --------------------------------------------------------------------------------


def render(provider: Provider, policy: RetryPolicy | None = None) -> str:
    """The contract page of one provider profile, as Markdown."""
    policy = policy if policy is not None else RetryPolicy()
    notes = profile_notes(provider.name) if provider.name in BUILTIN_PROVIDERS else Notes()
    p = provider
    out: list[str] = [f"# `{p.name}`", ""]
    out += [
        f'The idempotency contract of the built-in profile `"{p.name}"`, generated from '
        f'`postonce.BUILTIN_PROVIDERS["{p.name}"]`. Use it with '
        f'`postonce.Client(..., provider="{p.name}")`, or per call with `provider="{p.name}"`.',
        "",
    ]
    extra = {k: v for k, v in notes.fields.items() if k not in _INLINE_NOTES}
    if notes.general or extra:
        out += ['!!! note "Notes in the profile\'s source"', ""]
        if notes.general:
            out += [f"    {' '.join(notes.general)}", ""]
        out += [f"    - `{name}`: {text}" for name, text in extra.items()]
        out.append("")

    # The key
    out += ["## How the key travels", ""]
    if p.key_transport == "header":
        out += [
            f"In the request header `{p.key_field}`, as the raw value (never quoted): "
            f"`{p.key_field}: {EXAMPLE_KEY}`. A key you pass yourself in that header "
            "counts as `key=`.",
            "",
        ]
    else:
        out += [
            f"In the top-level field `{p.key_field}` of the JSON body. The body must be a "
            f"JSON object (`json={{...}}`); postonce adds `{p.key_field}` with the stored key "
            f"to the stored body, so every send carries it. A key you put in `{p.key_field}` "
            "yourself counts as `key=`.",
            "",
        ]
    minted_fits = True
    try:
        check_key(mint_key(), p, reference=None)
    except postonce.InvalidKey:
        minted_fits = False
    charset = _UNIVERSAL_CHARSET
    if p.key_pattern is not None:
        charset += f", and matching the regular expression `{p.key_pattern}`"
    out += [
        "| key rule | value |",
        "| --- | --- |",
        f"| length | {p.key_min_length} to {p.key_max_length} characters |",
        f"| characters | {charset} |",
        "| a key postonce mints (a canonical UUIDv4, 36 characters) | "
        + ("fits" if minted_fits else "**does not fit**: pass `key=`")
        + " |",
        "",
        "A key you choose with `key=` that breaks these rules is refused with `InvalidKey` "
        "before anything is stored or sent.",
        "",
    ]

    # Retention and horizon
    retention = p.retention.total_seconds()
    out += [
        "## Retention and the retry horizon",
        "",
        "| fact | value |",
        "| --- | --- |",
        f"| the provider remembers a key for at least | {duration(retention)}"
        + (f" \u2014 {notes.fields['retention']}" if "retention" in notes.fields else "")
        + " |",
        f"| postonce's horizon (`horizon_margin={policy.horizon_margin:g}`) | "
        f"{duration(horizon(p, policy).total_seconds())} after the first send that may "
        "have been delivered |",
        "",
        f"The horizon is the retention less `horizon_margin` of it: {duration(retention)} "
        f"\u00d7 (1 \u2212 {policy.horizon_margin:g}). No retry is sent after it. An intent whose "
        "delivery is still ambiguous then becomes `expired` (`IntentExpired`), and someone "
        "must [reconcile it](../reconcile.md). See [the retry horizon](../horizon.md).",
        "",
    ]

    # Fingerprint
    out += ["## The fingerprint", ""]
    if p.key_transport == "header":
        out += [
            "A SHA-256 of the method, the path and query, and the body: a JSON body as "
            "canonical JSON (sorted keys, no insignificant whitespace), any other body as "
            "its raw bytes. Headers, the key among them, are not part of it.",
        ]
    else:
        out += [
            "A SHA-256 of the method, the path and query, and the JSON body as canonical "
            f"JSON (sorted keys, no insignificant whitespace) without the `{p.key_field}` "
            "field. Headers are not part of it.",
        ]
    out += [
        "",
        '`fingerprint_fields=["amount", "customer.id"]` narrows it to those fields of a '
        "JSON object body. The same `intent=` with another fingerprint raises "
        "`IntentConflict` before anything is sent.",
        "",
    ]

    # Answers
    out += [
        "## Answers at a glance",
        "",
        "Every answer this profile singles out, gathered by what postonce does with it. "
        "Each is read by postonce's own classifier; the facts behind them are the "
        "profile's, from the [sources](#sources) below.",
        "",
        *summary(p, notes),
        "",
        "## What each answer means, and what postonce does",
        "",
        "Read by postonce's classifier under this profile, in this order: key-reuse "
        "answers; a 401 or 403 to a send after one that may have reached the provider "
        "(retried: the credentials were refused, which says nothing of the earlier send); "
        "in-flight answers (unless the retry hint says `false`); the retry hint "
        "saying `true`; answers documented as leaving the outcome unknown; the retry hint "
        "saying `false`; retried answers and statuses; the 5xx rule. Anything else is a "
        "final answer.",
        "",
        "| answer | postonce reads it as |",
        "| --- | --- |",
    ]
    for label, outcome in (*answer_rows(p), *_hint_rows(p)):
        action = ACTIONS.get(outcome, f"`{outcome.value}`")
        if label == _SUCCESS and outcome is Outcome.FINAL:
            action = _SUCCESS_ACTION
        out.append(f"| {label} | {action} |")
    out += ["", "### Key reuse", ""]
    if not p.mismatch:
        out += [
            "This profile names no key-reuse answer: the provider documents none that "
            "postonce can tell apart, so such an answer is taken as final.",
        ]
    else:
        shapes = "; ".join(_rule_label(r, False) for r in p.mismatch)
        out += [
            f"Matched: {shapes}"
            + (f" — {notes.fields['mismatch']}" if "mismatch" in notes.fields else "")
            + ". It is believed only when this key may have reached the server before "
            "(an earlier attempt was ambiguous or answered): to the first send of a fresh "
            "key the same answer is an ordinary **final answer**, returned as the "
            "`httpx.Response`.",
        ]
    out += [
        "",
        "### No answer",
        "",
        "A send that gets no answer is `not_sent` only when postonce can show the request "
        "never left the process: the transport never read its (non-empty) body, or httpx's "
        "own connection layer (httpcore) failed before writing it. Anything else, such as "
        "a connection dropped after the request was sent, on any transport, is "
        "`ambiguous`: retried with the same key until the horizon, never cancelled. See "
        "[ambiguity](../ambiguity.md).",
        "",
    ]

    # 5xx rule, replay marker, retry hint
    server_errors = SERVER_ERRORS[p.server_errors]
    replay_marker = (
        " or ".join(f"`{h}: true`" for h in p.replay_headers)
        + ' (`response.extensions["postonce"].replayed` is then `True`)'
        if p.replay_headers
        else 'none: this provider marks no replay, so `response.extensions["postonce"]'
        ".replayed` is always `False`"
    )
    hint = (
        f"`{p.retry_hint_header}: true` retries with the same key; `false` stops retries, an "
        "in-flight answer's too (indeterminate for a 5xx or a key an earlier attempt may "
        "hold, final otherwise); only a key-reuse answer outranks it"
        if p.retry_hint_header
        else "none"
    )
    out += [
        "## 5xx answers, replays and retry hints",
        "",
        "| fact | value |",
        "| --- | --- |",
        f'| a 5xx (`server_errors="{p.server_errors}"`) | {server_errors}'
        + (f" \u2014 {notes.fields['server_errors']}" if "server_errors" in notes.fields else "")
        + " |",
        f"| replay marker | {replay_marker} |",
        f"| retry hint header | {hint} |",
        f"| retryable statuses | {_code(sorted(p.retryable_statuses))} |",
        "",
    ]

    # Sources
    out += ["## Sources", ""]
    if p.sources:
        out += [f"- {_source(s)}" for s in p.sources]
    else:
        out += ["None recorded in the profile."]
    out.append("")
    return "\n".join(out)


def render_index(providers: Mapping[str, Provider], policy: RetryPolicy | None = None) -> str:
    """The page listing every built-in profile side by side."""
    policy = policy if policy is not None else RetryPolicy()
    out = [
        "# Provider profiles",
        "",
        "The built-in profiles, generated from `postonce.BUILTIN_PROVIDERS`. Each page "
        "says how the key travels, which keys the API takes, how long it remembers them "
        "and so how long postonce retries, what its answers mean, and where each fact "
        "comes from. For any other API, [write a profile](../custom-provider.md).",
        "",
        f"Horizons are for the default `horizon_margin={policy.horizon_margin:g}`.",
        "",
        "| profile | key in | max length | retention | horizon | in flight | key reuse "
        "| 5xx rule | replay marker |",
        "| --- | --- | ---: | --- | --- | --- | --- | --- | --- |",
    ]
    for name in sorted(providers):
        p = providers[name]
        where = "header" if p.key_transport == "header" else "body"
        in_flight = "; ".join(_rule_label(r, False) for r in p.in_flight) or "none"
        mismatch = "; ".join(_rule_label(r, False) for r in p.mismatch) or "none"
        replay = _code(p.replay_headers) if p.replay_headers else "none"
        out.append(
            f"| [`{name}`]({name}.md) | {where} `{p.key_field}` | {p.key_max_length} "
            f"| {duration(p.retention.total_seconds())} "
            f"| {duration(horizon(p, policy).total_seconds())} "
            f"| {in_flight} | {mismatch} | `{p.server_errors}` | {replay} |"
        )
    out.append("")
    return "\n".join(out)


def pages(providers: Mapping[str, Provider] | None = None) -> dict[str, str]:
    """Every generated page: path relative to docs/ -> Markdown."""
    providers = providers if providers is not None else BUILTIN_PROVIDERS
    out = {INDEX_PATH: render_index(providers)}
    for provider in providers.values():
        out[page_path(provider)] = render(provider)
    return out


def main() -> None:
    """Write the pages into the site being built (mkdocs-gen-files)."""
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as page:
            page.write(text)


if __name__ in {"__main__", "<run_path>"}:
    main()
