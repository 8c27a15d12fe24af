"""The plugfest matrix as a result document and pages: ``matrix.json`` (schema ``reports/matrix.schema.json``),
``matrix.html`` (one table per kind and relay, rows x columns, one colour per outcome, each cell a link to its
evidence) and, per cell, ``cells/<id>/index.html`` (participants and their logs, what was exchanged, the
steps, the verdicts and who was blamed, with links to the role suites' reports); and the matrix cut by MOQT draft
and by RDMA binding (reports.matrix_cuts), one page per value beside matrix.html, every page linking to the others.

Every page is self-contained (inline CSS, no scripts, nothing fetched) and links only to files in the
matrix's folder, so the folder can be archived or served as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from kvconform.reports.matrix_cuts import AXES, cut_document, cut_file, matrix_cuts

__all__ = ["SCHEMA_FILE", "render_cell_page", "render_matrix", "render_nav", "schema", "write_matrix"]

SCHEMA_FILE = Path(__file__).with_name("matrix.schema.json")
LABEL = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "not-run": "not run"}
MARK = {"pass": "✓", "fail": "✗", "inconclusive": "?", "not-run": "–"}

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.8em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #bbb;padding:.3em .5em;vertical-align:top;font-size:.9em;text-align:left}
th{background:#eef0f3}
table.matrix td.cell{min-width:10em;text-align:center}
table.matrix th.corner{font-weight:normal;font-size:.8em;color:#555}
td.cell a.verdict{display:block;font-weight:700;text-decoration:none;color:#111;padding:.2em 0}
.pass{background:#b9e4b9}.fail{background:#f3a6a6}.inconclusive{background:#f6d98e}
.not-a-cell{background:#e6e6e6;color:#666;font-size:.8em}.not-run{background:#f4f4f4;color:#666}
.v{display:inline-block;padding:0 .45em;border-radius:3px;font-weight:600;white-space:nowrap}
.marks{font-size:.8em;white-space:nowrap}.blame{font-size:.8em;color:#700}
.msg{font-family:monospace;font-size:.85em;white-space:pre-wrap}
pre{background:#f7f7f7;border:1px solid #ddd;padding:.5em;max-height:30em;overflow:auto;font-size:.8em}
.meta td:first-child{font-weight:600;width:11em}
.legend span{margin-right:.6em}
nav.cuts{margin:.5em 0 1em;font-size:.9em}nav.cuts a{margin-right:.4em}nav.cuts a.here{font-weight:700}
"""


def schema() -> dict[str, Any]:
    """The published JSON Schema of matrix.json."""
    doc: dict[str, Any] = json.loads(SCHEMA_FILE.read_text("utf-8"))
    return doc


def _badge(outcome: str, text: str | None = None) -> str:
    return f'<span class="v {escape(outcome)}">{escape(text or LABEL.get(outcome, outcome))}</span>'


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _href(path: str | None) -> str:
    return escape((path or "").replace(os.sep, "/"))


def _role(suite: str) -> str:
    return suite.split("-", 1)[1]


# ---- the matrix page ------------------------------------------------------------------------------------


def _cell_td(cell: Mapping[str, Any]) -> str:
    outcome = cell["outcome"]
    marks = [f'exchange {MARK[cell["exchange"]["outcome"]]}']
    suite_marks = [f'{_role(s)} {MARK.get(v["outcome"], "?")}' for s, v in cell["suites"].items()]
    if any(v["outcome"] != "not-run" for v in cell["suites"].values()):
        marks.append("suites " + " ".join(suite_marks))
    blamed = sorted({f'{b["implementation"]} ({_role(b["role"])})' for b in cell["blame"] if not b.get("undetermined")})
    blame = f'<div class="blame">blames {escape(", ".join(blamed))}</div>' if blamed else ""
    if outcome == "inconclusive" and cell["exchange"].get("unavailable"):
        u = cell["exchange"]["unavailable"]
        blame = f'<div class="blame">{escape(u["implementation"])} ({escape(_role(u["role"]))}) not startable</div>'
    title = cell["reason"][:400]
    return (f'<td class="cell {escape(outcome)}" data-cell="{escape(cell["id"])}" data-outcome="{escape(outcome)}" '
            f'title="{escape(title)}"><a class="verdict" href="{_href(cell["evidence"])}">{LABEL[outcome]}</a>'
            f'<div class="marks">{escape(" · ".join(marks))}</div>{blame}</td>')


def _table_html(table: Mapping[str, Any], cells: Mapping[str, Mapping[str, Any]]) -> str:
    at = {(c["row"], c["column"]): c["cell"] for c in table["cells"]}
    why = {(c["row"], c["column"]): c["why"] for c in table["not_cells"]}
    rows_role, cols_role = _role(table["rows"]["role"]), _role(table["columns"]["role"])
    head = "".join(f'<th scope="col" class="col">{escape(c)}</th>' for c in table["columns"]["implementations"])
    lines = [f'<section class="table" id="{escape(table["id"])}" data-kind="{escape(table["kind"])}">',
             f'<h2>{escape(table["title"])}</h2>',
             f'<table class="matrix"><thead><tr><th class="corner">{escape(rows_role)} ↓ · '
             f"{escape(cols_role)} →</th>{head}</tr></thead><tbody>"]
    for row in table["rows"]["implementations"]:
        tds = []
        for col in table["columns"]["implementations"]:
            cid = at.get((row, col))
            if cid is not None:
                tds.append(_cell_td(cells[cid]))
            else:
                reason = escape(why.get((row, col), ""))
                tds.append(f'<td class="cell not-a-cell" data-outcome="not-a-cell" title="{reason}">'
                           f'not a cell<div class="marks">{reason}</div></td>')
        lines.append(f'<tr><th scope="row" class="row">{escape(row)}</th>{"".join(tds)}</tr>')
    lines.append("</tbody></table></section>")
    return "\n".join(lines)


def render_nav(cuts: Mapping[str, Mapping[str, list[str]]], here: str = "matrix.html") -> str:
    """The links from every matrix page to the whole matrix and to each draft's and binding's cut."""
    if not cuts:
        return ""

    def link(href: str, text: str) -> str:
        mark = ' class="here"' if href == here else ""
        return f'<a href="{_href(href)}"{mark}>{escape(text)}</a>'

    parts = [link("matrix.html", "all cells")]
    for axis, values in cuts.items():
        parts.append(f"{escape(AXES[axis][1])}: " + " ".join(link(cut_file(axis, v), v) for v in values))
    return '<nav class="cuts">' + " · ".join(parts) + "</nav>"


def render_matrix(doc: Mapping[str, Any], heading: str = "kvconform plugfest matrix", nav: str = "") -> str:
    """The matrix page (or a cut of it: ``heading`` says which, ``nav`` links the others)."""
    meta, summary = doc["meta"], doc["summary"]
    cells = {c["id"]: c for c in doc["cells"]}
    out = [f"<h1>{escape(heading)}</h1>", nav]
    legend = " ".join(f'{_badge(o)}' for o in ("pass", "fail", "inconclusive")) + \
        ' <span class="v not-a-cell">not a cell</span>'
    out.append(f'<p class="legend">{legend} — a cell passes only when its exchange completed and was verified '
               "and every participant's role suite passed; fail names who broke it; inconclusive: something could "
               "not be started, reached or observed.</p>")
    counts = ", ".join(f"{n} {o}" for o, n in summary["outcomes"].items())
    registry = meta["registry"]
    rows = [("registry", f'{registry["name"]} ({registry["path"]}), sha256 {registry["sha256"]}'),
            ("cells", f'{summary["cells"]}: {counts}' + (f'; {summary["isolation_cells"]} isolation exchanges'
                                                         if summary["isolation_cells"] else "")),
            ("role suites", ("not run (--no-suites)" if not meta["suites_run"] else
                             f'{summary["suites"]}: ' + ", ".join(f"{n} {o}" for o, n in
                                                                  sorted(summary["suite_outcomes"].items())))),
            ("command", " ".join(meta["command_line"])), ("seed", str(meta["seed"])),
            ("started / finished", f'{meta["started"]} / {meta["finished"]}'),
            ("harness", f'kvconform {meta["harness"]["kvconform"]}, Python {meta["harness"]["python"]}, '
                        f'host {meta["host"]}')]
    out.append('<table class="meta">' + "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows)
               + "</table>")
    for table in doc["tables"]:
        out.append(_table_html(table, cells))
    for kind, why in doc["skipped_tables"].items():
        out.append(f'<p class="skipped">No {escape(kind)} table: {escape(why)}.</p>')
    if doc["suites"]:
        out.append("<h2>Role suites</h2><table class=\"suites\"><tr><th>implementation</th><th>suite</th>"
                   "<th>outcome</th><th>what</th><th>report</th></tr>")
        for s in doc["suites"]:
            link = f'<a href="{_href(s["report"])}">coverage</a>' if s.get("report") else ""
            log = f' <a href="{_href(s["log"])}">log</a>' if s.get("log") else ""
            out.append(f'<tr data-outcome="{escape(s["outcome"])}"><td>{escape(s["implementation"])}</td>'
                       f'<td>{escape(s["suite"])}</td><td>{_badge(s["outcome"])}</td>'
                       f'<td class="msg">{escape(s["message"])}</td><td>{link}{log}</td></tr>')
        out.append("</table>")
    isolation = [c for c in doc["cells"] if c["isolation"]]
    if isolation:
        out.append("<h2>Isolation exchanges</h2><p>Run only to judge failed cells: each non-reference participant "
                   "with the reference in every other role.</p><ul>")
        out += [f'<li>{_badge(c["exchange"]["outcome"])} <a href="{_href(c["evidence"])}">{escape(c["id"])}</a></li>'
                for c in isolation]
        out.append("</ul>")
    out.append("<h2>Implementations</h2><table><tr><th>name</th><th>vendor</th><th>version</th><th>roles</th>"
               "<th>description</th></tr>")
    for impl in doc["implementations"]:
        roles = ", ".join(impl["roles"]) + (" (reference)" if impl["reference"] else "")
        info = ", ".join(impl["info_roles"])
        if info:
            roles += f"; no KVCS/TLKV/KBTP role: {info}" if not impl["roles"] else f"; informational: {info}"
        out.append(f'<tr><td>{escape(impl["name"])}</td><td>{escape(impl["vendor"])}</td><td>{escape(impl["version"])}'
                   f'</td><td>{escape(roles)}</td><td>{escape(impl["description"])}</td></tr>')
    out.append("</table>")
    for entry in doc["no_matrix_role"]:
        notes = "".join(f"<li><b>{escape(r)}</b>: {escape(n)}</li>" for r, n in entry["notes"].items() if n)
        if notes:
            out.append(f'<p>{escape(entry["implementation"])}: roles that make no cell</p><ul>{notes}</ul>')
    out.append(f'<p><a href="matrix.json">matrix.json</a> (schema: {escape(doc["format"])})</p>')
    return _page(heading, "\n".join(out))


# ---- a cell's evidence page ------------------------------------------------------------------------------


def render_cell_page(cell: Mapping[str, Any], result: Mapping[str, Any], folder: Path) -> str:
    """The evidence page of one cell (written into its folder; links relative to it)."""
    up = "../../"
    out = [f'<p><a href="{up}matrix.html">matrix</a></p>',
           f'<h1>{escape(cell["id"])} {_badge(cell["outcome"])}</h1>']
    ex = cell["exchange"]
    out.append(f'<h2>Verdict</h2><p class="msg" id="reason">{escape(cell["reason"])}</p>'
               f'<p>exchange {_badge(ex["outcome"])}</p><div class="msg" id="message">{escape(ex["message"])}</div>')
    if cell["blame"]:
        out.append('<h3>Blamed</h3><ul class="blamed">')
        for b in cell["blame"]:
            link = f' <a href="{up}{_href(b["evidence"])}">evidence</a>' if b.get("evidence") else ""
            out.append(f'<li><b>{escape(b["implementation"])}</b> ({escape(b["role"])}): {escape(b["why"])}{link}'
                       f'<div class="msg">{escape(b.get("message", ""))}</div></li>')
        out.append("</ul>")
    out.append("<h2>Participants</h2><table><tr><th>role</th><th>implementation</th><th>suite</th><th>log</th></tr>")
    logs = result.get("logs", {})
    for suite, name in cell["participants"].items():
        s = cell["suites"].get(suite, {"outcome": "not-run", "message": ""})
        report = f' <a href="{up}{_href(s["report"])}">report</a>' if s.get("report") else ""
        log = f'<a href="{_href(logs[suite])}">{escape(logs[suite])}</a>' if suite in logs else ""
        out.append(f'<tr><td>{escape(suite)}</td><td>{escape(name)}</td><td>{_badge(s["outcome"])} '
                   f'<span class="msg">{escape(s.get("message", ""))}</span>{report}</td><td>{log}</td></tr>')
    out.append("</table>")
    if cell.get("identifiers"):
        out.append("<h2>Identifiers and ports</h2><table class=\"meta\">" + "".join(
            f"<tr><td>{escape(str(k))}</td><td>{escape(str(v))}</td></tr>" for k, v in cell["identifiers"].items())
            + "</table>")
    out.append("<h2>Steps</h2><table><tr><th>t (s)</th><th>step</th><th>details</th></tr>")
    for step in result.get("steps", []):
        details = {k: v for k, v in step.items() if k not in ("t", "what")}
        out.append(f'<tr><td>{step["t"]}</td><td>{escape(step["what"])}</td>'
                   f'<td class="msg">{escape(json.dumps(details, default=str)) if details else ""}</td></tr>')
    out.append("</table>")
    out.append(f'<h2>What was exchanged</h2><pre id="exchanged">'
               f'{escape(json.dumps(result.get("exchanged", {}), indent=1, default=str))}</pre>')
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "index.html")
    out.append("<p>Files: " + ", ".join(f'<a href="{_href(f)}">{escape(f)}</a>' for f in files) + "</p>")
    out.append("<h2>Logs</h2>")
    for suite, name in logs.items():
        path = folder / name
        text = path.read_text("utf-8", "replace") if path.is_file() else ""
        out.append(f'<details open><summary>{escape(suite)}: {escape(cell["participants"].get(suite, ""))}</summary>'
                   f'<pre class="log">{escape(text[-20000:])}</pre></details>')
    if result.get("traceback"):
        out.append(f'<h3>Harness traceback</h3><pre>{escape(str(result["traceback"]))}</pre>')
    return _page(f"matrix cell {cell['id']}", "\n".join(out))


def write_matrix(doc: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]], out: Path) -> Path:
    """Write matrix.json, matrix.html and every cell's evidence page; returns matrix.html."""
    out.mkdir(parents=True, exist_ok=True)
    for cell in doc["cells"]:
        folder = out / cell["dir"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "index.html").write_text(render_cell_page(cell, results.get(cell["id"], {}), folder), "utf-8")
    (out / "matrix.json").write_text(json.dumps(doc, indent=1, default=str) + "\n", "utf-8")
    cuts = matrix_cuts(doc)
    page = out / "matrix.html"
    page.write_text(render_matrix(doc, nav=render_nav(cuts)), "utf-8")
    for axis, values in cuts.items():
        for value, ids in values.items():
            name = cut_file(axis, value)
            (out / name).write_text(render_matrix(cut_document(doc, axis, value, ids),
                                                  heading=f"kvconform plugfest matrix: {AXES[axis][1]} {value}",
                                                  nav=render_nav(cuts, here=name)), "utf-8")
    return page
