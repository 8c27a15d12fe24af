"""The gate's findings as text: a Markdown summary for a pull-request comment or a CI step summary, and the lines
the terminal shows."""

from __future__ import annotations

from kvconform.gate.classify import Finding, GateResult

__all__ = ["console_lines", "markdown"]

TITLES = {
    "new_failures": "New failures",
    "unexpected_passes": "Unexpected passes",
    "flaky": "Flaky",
    "fixed": "Fixed",
    "still_failing": "Still failing",
    "added": "Added checks",
    "removed": "Removed checks",
}
_SHOWN = 50  # rows per table: a PR comment stays readable; the rest are counted
_MESSAGE = 240


def _cell(text: str | None, limit: int = _MESSAGE) -> str:
    if not text:
        return ""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat.replace("|", "\\|").replace("<", "&lt;")


_COUNTED = {  # a gating category's count in the headline: singular, plural
    "new_failures": ("new failure", "new failures"),
    "unexpected_passes": ("unexpected pass", "unexpected passes"),
    "added": ("added check", "added checks"),
    "removed": ("removed check", "removed checks"),
}


def _headline(result: GateResult) -> str:
    if not result.gating:
        return "PASSED: nothing new"
    parts = []
    for name, (one, many) in _COUNTED.items():
        n = len(result.gating_in(name))
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    return "FAILED: " + ", ".join(parts)


def _table(findings: list[Finding]) -> list[str]:
    lines = ["| check | now | baseline | message | note |", "| --- | --- | --- | --- | --- |"]
    for f in findings[:_SHOWN]:
        gate = " (gates)" if f.gating else ""
        lines.append(f"| `{_cell(f.check, 300)}` | {f.verdict or '—'}{gate} | {f.expected or '—'} | "
                     f"{_cell(f.message)} | {_cell(f.note)} |")
    if len(findings) > _SHOWN:
        lines.append(f"\n…and {len(findings) - _SHOWN} more.")
    return lines


def markdown(result: GateResult) -> str:
    """The summary: the headline, a count per category, then a table per category that has findings."""
    lines = [f"## kvconform gate: {_headline(result)}", "",
             f"Judged **{_cell(result.judged, 400)}** against **{_cell(result.baseline, 400)}**.", "",
             "| category | checks |", "| --- | ---: |"]
    lines += [f"| {title} | {len(result.category(name))} |" for name, title in TITLES.items()]
    for name, title in TITLES.items():
        findings = result.category(name)
        if findings:
            lines += ["", f"### {title}", "", *_table(findings)]
    return "\n".join(lines) + "\n"


def console_lines(result: GateResult) -> list[str]:
    """What the terminal shows: the headline, the counts, each new failure, unexpected pass and flaky check, and
    each added or removed check that gates."""
    lines = [f"kvconform gate: {_headline(result)} (judged {result.judged} against {result.baseline})",
             "  " + ", ".join(f"{len(result.category(n))} {t.lower()}" for n, t in TITLES.items())]
    for name in ("new_failures", "unexpected_passes", "flaky", "added", "removed"):
        for f in result.category(name):
            if name in ("added", "removed") and not f.gating:
                continue  # listed in the summary; on the terminal only when they gate
            mark = "GATES" if f.gating else "     "
            lines.append(f"  {mark} {TITLES[name].lower()}: {f.check}: {f.verdict or '—'} "
                         f"(baseline {f.expected or '—'})" + (f"; {_cell(f.note, 200)}" if f.note else ""))
    return lines
