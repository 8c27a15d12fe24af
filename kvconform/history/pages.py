"""The history pages, self-contained like the other reports (inline CSS, no scripts, nothing fetched; every link
relative and inside the output folder, so it can be published or archived as it is):

    index.html              every implementation (identity) with its newest run, its runs, its flaky checks
    latest.html             the newest run stored (a copy of its run page), with the newest of each identity
    latest-<key>.html       the newest run of one identity (<key>: the first 12 hex digits of its identity key)
    identity-<key>.html     one identity's runs, its requirement × run table (changes highlighted), its flaky list
    runs/<run id>.html      one run: identity, inputs, every check; written once, never rewritten

A run page links only to pages whose names never change (the index, latest.html, its identity's page, the run
before it), so it never needs rewriting when later runs are stored; every other page is rewritten by each
``kvconform history``. An existing run page is kept byte for byte (a newer kvconform's rendering applies to new
runs only: delete a page to re-render it); it carries its run's coverage SHA-256, and a folder whose page of a
run id belongs to another run (another store) is refused rather than mixed. A run's report folder and evidence
paths are shown, not linked: they are on the machine that ran it, not in the published folder.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from kvconform.history.timeline import History, Timeline
from kvconform.store import RunRecord

__all__ = ["HistoryError", "Written", "identity_file", "latest_file", "run_file", "write_history"]

SHOWN_RUNS = 40  # columns of the requirement × run table: the newest runs; the run list has them all
VERDICTS = ("pass", "fail", "inconclusive", "not-applicable", "xfail", "not-reached")
RUN_MARK = "kvconform-run"

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #bbb;padding:.25em .45em;vertical-align:top;font-size:.9em;text-align:left}
th{background:#eef0f3}
.v{display:inline-block;padding:0 .4em;border-radius:3px;font-weight:600;white-space:nowrap}
.pass{background:#c8f0c8}.fail{background:#f7b6b6}.inconclusive{background:#f7dc9c}
.not-applicable{background:#dde3ea}.xfail{background:#e4d2f3}.not-reached{background:#fff;border:1px dotted #b08a2e}
.absent{color:#999}
table.timeline td.verdict{text-align:center;font-size:.8em;white-space:nowrap}
table.timeline td.changed{outline:3px solid #1a4fd6;outline-offset:-3px;font-weight:700}
table.timeline th.row{font-family:monospace;font-weight:normal;white-space:nowrap}
tr.moved th.row{background:#dfe8fb}
.msg{font-family:monospace;font-size:.85em;white-space:pre-wrap}
.nid,code{font-family:monospace;font-size:.85em;word-break:break-all}
.meta th{width:12em;background:#f7f7f7}
nav.history{margin:.5em 0 1em;font-size:.9em}nav.history a{margin-right:.6em}
.note{color:#555;font-size:.9em}
"""


class HistoryError(Exception):
    """The output folder cannot take the pages; the message names the file."""


def run_file(run_id: int) -> str:
    return f"runs/{run_id}.html"


def identity_file(timeline: Timeline) -> str:
    return f"identity-{timeline.slug}.html"


def latest_file(timeline: Timeline) -> str:
    return f"latest-{timeline.slug}.html"


def _page(title: str, body: str, head: str = "") -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{head}<title>{escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _badge(verdict: str | None, text: str | None = None) -> str:
    if verdict is None:
        return '<span class="absent">—</span>'
    return f'<span class="v {escape(verdict)}">{escape(text or verdict)}</span>'


def _a(href: str, text: str, cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return f'<a href="{escape(href)}"{klass}>{escape(text)}</a>'


def _name(run: RunRecord) -> str:
    version = f" {run.implementation_version}" if run.implementation_version else ""
    return f"{run.implementation}{version}"


def _counts(run: RunRecord) -> str:
    counts = Counter(c.verdict for c in run.checks)
    order = [v for v in VERDICTS if v in counts] + sorted(set(counts) - set(VERDICTS))
    return " ".join(_badge(v, f"{counts[v]} {v}") for v in order) or '<span class="note">no checks</span>'


def _nav(root: str, timeline: Timeline | None = None, previous: int | None = None) -> str:
    links = [_a(f"{root}index.html", "all implementations"), _a(f"{root}latest.html", "latest run")]
    if timeline is not None:
        links.append(_a(f"{root}{identity_file(timeline)}", "this implementation's history", "identity"))
        links.append(_a(f"{root}{latest_file(timeline)}", "its latest run"))
    if previous is not None:
        links.append(_a(f"{root}{run_file(previous)}", f"previous run #{previous}", "previous"))
    return '<nav class="history">' + "".join(links) + "</nav>"


def _meta(run: RunRecord) -> str:
    rows: list[tuple[str, Any]] = [
        ("implementation", run.implementation), ("version", run.implementation_version),
        ("vendor", run.implementation_vendor), ("build", run.implementation_build),
        ("image digest", run.image_digest), ("target", f"{run.target_name} ({run.target_kind}: {run.target_value})"),
        ("suites", ", ".join(run.suites)), ("binding", run.binding), ("MOQT draft", run.draft),
        ("harness", f"kvconform {run.harness_version}, commit {run.harness_commit}"),
        ("testbed", f"{run.testbed_name or '—'}, sha256 {run.testbed_sha256 or '—'}"),
        ("catalogs", ", ".join(f"{k} sha256 {v or '—'}" for k, v in sorted(run.catalogs.items())) or None),
        ("seed", run.seed), ("strict", "yes" if run.strict else "no"), ("exit status", run.exit_code),
        ("started / finished", f"{run.started} / {run.finished}"), ("recorded", run.recorded),
        ("report folder", run.report_dir), ("identity key", run.identity_key),
        ("coverage.json sha256", run.coverage_sha256)]
    body = "".join(f'<tr><th>{escape(k)}</th><td class="nid">{escape(str(v))}</td></tr>' for k, v in rows
                   if v is not None and v != "")
    pics = "".join(f'<tr data-pics="{escape(k)}"><th>{escape(k)}</th><td class="nid">'
                   f"{escape(json.dumps(v, default=str))}</td></tr>" for k, v in sorted(run.pics.items()))
    out = f'<table class="meta" id="identity">{body}</table>'
    if pics:
        out += f'<h2>Declared PICS</h2><table class="meta" id="pics">{pics}</table>'
    return out


def render_run(run: RunRecord, timeline: Timeline, root: str, heading: str | None = None, lead: str = "") -> str:
    """A run's page; ``root`` is the path from the page's folder to the output folder ("../" under runs/)."""
    assert run.run_id is not None
    out = [_nav(root, timeline, timeline.previous(run.run_id)),
           f'<h1 id="run" data-run-id="{run.run_id}">{escape(heading or f"Run #{run.run_id}")}: '
           f"{escape(_name(run))}</h1>", lead, f'<p id="counts">{_counts(run)}</p>', _meta(run),
           f'<h2>Checks ({len(run.checks)})</h2><table id="checks"><tr><th>check</th><th>verdict</th><th>level</th>'
           "<th>requirements</th><th>message</th><th>evidence (in the report folder)</th></tr>"]
    for c in run.checks:
        out.append(f'<tr data-check="{escape(c.nodeid)}" data-verdict="{escape(c.verdict)}">'
                   f'<td class="nid">{escape(c.nodeid)}</td><td>{_badge(c.verdict)}</td>'
                   f'<td>{escape(c.level or "")}</td><td class="nid">{escape(", ".join(c.reqs))}</td>'
                   f'<td class="msg">{escape(c.message)}</td><td class="nid">{escape(c.evidence or "")}</td></tr>')
    out.append("</table>")
    head = f'<meta name="{RUN_MARK}" content="{escape(run.coverage_sha256)}">'
    return _page(f"kvconform run #{run.run_id}: {_name(run)}", "\n".join(out), head)


def _flaky_table(history: History, timelines: list[Timeline], root: str) -> str:
    rows = []
    for t in timelines:
        for check, runs in t.flaky.items():
            seen = " ".join(f'{_a(f"{root}{run_file(i)}", f"#{i}")} {_badge(v)}' for i, v in runs)
            rows.append(f'<tr data-flaky="{escape(check)}"><td>{escape(_name(t.latest))}</td>'
                        f'<td class="nid">{escape(check)}</td><td>{seen}</td></tr>')
    if not rows:
        return '<p id="flaky" class="note">No flaky check: every check had one verdict across the stored runs of ' \
               "its implementation and inputs.</p>"
    return ('<table id="flaky"><tr><th>implementation</th><th>check</th><th>verdict in each stored run</th></tr>'
            + "".join(rows) + "</table>")


_FLAKY_NOTE = ('<p class="note">Flaky, as <code>kvconform gate</code> reports it: a check whose verdict differs '
               "across the stored runs of the same implementation and inputs.</p>")


def render_timeline(history: History, timeline: Timeline) -> str:
    """One identity's page: its runs, the requirement × run table, its flaky checks."""
    latest = timeline.latest
    out = [_nav("", timeline), f"<h1>History of {escape(_name(latest))}</h1>",
           f'<p class="note">{escape(", ".join(latest.suites))} against {escape(latest.target_name)}; '
           f"{len(timeline.runs)} stored runs with the same identity key <code>{escape(timeline.key)}</code> "
           "(implementation, harness version, catalogs, testbed, PICS, binding, draft and suites).</p>",
           "<h2>Runs</h2>", '<table id="runs"><tr><th>run</th><th>recorded</th><th>seed</th><th>checks</th>'
           "<th>exit status</th></tr>"]
    for run in reversed(timeline.runs):
        assert run.run_id is not None
        out.append(f'<tr data-run="{run.run_id}"><td>{_a(run_file(run.run_id), f"#{run.run_id}")}</td>'
                   f"<td>{escape(run.recorded or '')}</td><td>{run.seed}</td><td>{_counts(run)}</td>"
                   f"<td>{escape(str(run.exit_code))}</td></tr>")
    out.append("</table>")
    shown = timeline.runs[-SHOWN_RUNS:]
    skip = len(timeline.runs) - len(shown)
    changed = timeline.changed_rows()
    out.append(f'<h2>Requirements × runs</h2><p class="note">{len(changed)} of {len(timeline.rows)} requirements '
               "changed verdict; those rows come first, and each changed verdict is outlined (the verdict differs "
               "from the run before). A check citing no requirement is a row of its own."
               + (f" The oldest {skip} runs are not shown." if skip else "") + "</p>")
    head = "".join(f'<th scope="col">{_a(run_file(r.run_id or 0), f"#{r.run_id}")}</th>' for r in shown)
    out.append(f'<table class="timeline" id="timeline"><thead><tr><th>requirement</th>{head}</tr></thead><tbody>')
    for row, verdicts in timeline.rows.items():
        cells = []
        for i in range(skip, len(verdicts)):
            verdict = verdicts[i]
            changed_here = timeline.changed(verdicts, i)
            klass = "verdict changed" if changed_here else "verdict"
            was = f' title="was {escape(verdicts[i - 1] or "absent")}"' if changed_here else ""
            cells.append(f'<td class="{klass}" data-verdict="{escape(verdict or "absent")}"{was}>'
                         f"{_badge(verdict)}</td>")
        moved = ' class="moved"' if row in changed else ""
        out.append(f'<tr data-row="{escape(row)}"{moved}><th scope="row" class="row">{escape(row)}</th>'
                   f'{"".join(cells)}</tr>')
    out.append("</tbody></table>")
    out += ["<h2>Flaky checks</h2>", _FLAKY_NOTE, _flaky_table(history, [timeline], "")]
    return _page(f"kvconform history: {_name(latest)}", "\n".join(out))


def render_index(history: History) -> str:
    """The overview: each identity with its newest run, and every flaky check."""
    out = [_nav(""), "<h1>kvconform history</h1>"]
    if not history.timelines:
        out.append('<p id="empty">No run is stored yet: <code>kvconform run ... --results-db URL</code> records '
                   "one.</p>")
        return _page("kvconform history", "\n".join(out))
    out.append(f'<p class="note">{len(history.runs)} stored runs of {len(history.timelines)} implementations '
               "(an implementation here is one identity: the same implementation and inputs).</p>")
    out.append('<table id="implementations"><tr><th>implementation</th><th>suites</th><th>target</th><th>runs</th>'
               "<th>newest run</th><th>its checks</th><th>requirements changed in it</th><th>flaky</th>"
               "<th>pages</th></tr>")
    for t in history.timelines:
        latest = t.latest
        last = len(t.runs) - 1
        moved = sum(1 for v in t.rows.values() if t.changed(v, last))
        out.append(f'<tr data-identity="{escape(t.slug)}"><td>{escape(_name(latest))}</td>'
                   f'<td>{escape(", ".join(latest.suites))}</td><td class="nid">{escape(latest.target_name)}</td>'
                   f"<td>{len(t.runs)}</td><td>{_a(run_file(latest.run_id or 0), f'#{latest.run_id}')} "
                   f'{escape(latest.recorded or "")}</td><td>{_counts(latest)}</td><td>{moved}</td>'
                   f"<td>{len(t.flaky)}</td><td>{_a(identity_file(t), 'history', 'identity')} · "
                   f"{_a(latest_file(t), 'latest', 'latest')}</td></tr>")
    out.append("</table>")
    out += ["<h2>Flaky checks</h2>", _FLAKY_NOTE, _flaky_table(history, list(history.timelines), "")]
    return _page("kvconform history", "\n".join(out))


def _latest_lead(history: History, run: RunRecord, timeline: Timeline | None) -> str:
    lead = (f'<p class="note" id="permanent">The newest stored run{" of this implementation" if timeline else ""}; '
            f"this page follows the newest, {_a(run_file(run.run_id or 0), f'run #{run.run_id}')} is its "
            "permanent page.</p>")
    if timeline is None and len(history.timelines) > 1:
        lead += ('<p id="per-identity">The newest run of each implementation: ' + " · ".join(
            _a(latest_file(t), f"{_name(t.latest)} (#{t.latest.run_id})") for t in history.timelines) + "</p>")
    return lead


@dataclass
class Written:
    """What a history run did to the folder."""

    runs_written: list[int]
    runs_kept: list[int]
    index: Path


def _write(path: Path, text: str) -> None:
    # written beside and renamed: a reader (a web server) never sees half a page
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, path)


def _check_kept(path: Path, run: RunRecord) -> None:
    try:
        text = path.read_text("utf-8", "replace")
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the existing run page: {exc.strerror or exc}") from None
    if f'<meta name="{RUN_MARK}" content="{run.coverage_sha256}">' not in text:
        raise HistoryError(f"{path}: the page of run #{run.run_id} there shows another run (not coverage.json "
                           f"sha256 {run.coverage_sha256}): the folder holds another store's history; choose "
                           "another --out")


def write_history(history: History, out: Path) -> Written:
    """Write the pages into ``out``: new run pages, then every page that follows the newest runs."""
    written, kept = [], []
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
        for run in history.runs:
            assert run.run_id is not None
            path = out / run_file(run.run_id)
            if path.exists():
                _check_kept(path, run)
                kept.append(run.run_id)
                continue
            _write(path, render_run(run, history.timeline_of(run), "../"))
            written.append(run.run_id)
        for t in history.timelines:
            _write(out / identity_file(t), render_timeline(history, t))
            _write(out / latest_file(t), render_run(t.latest, t, "", heading=f"Latest run (#{t.latest.run_id})",
                                                    lead=_latest_lead(history, t.latest, t)))
        if history.timelines:
            newest = history.runs[-1]
            _write(out / "latest.html", render_run(newest, history.timeline_of(newest), "",
                                                   heading=f"Latest run (#{newest.run_id})",
                                                   lead=_latest_lead(history, newest, None)))
        else:
            _write(out / "latest.html", render_index(history))
        _write(out / "index.html", render_index(history))
    except OSError as exc:
        raise HistoryError(f"{exc.filename or out}: cannot write: {exc.strerror or exc}") from None
    return Written(written, kept, out / "index.html")
