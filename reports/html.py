"""The coverage report as one self-contained HTML page (inline CSS, no scripts)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.6em}h3{font-size:1.05em}
table{border-collapse:collapse;width:100%;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .45em;vertical-align:top;font-size:.9em;text-align:left}
th{background:#f0f0f0}
.v{display:inline-block;padding:0 .4em;border-radius:3px;font-weight:600;white-space:nowrap}
.pass{background:#c8f0c8}.fail{background:#f7b6b6}.inconclusive{background:#f7dc9c}
.not-applicable{background:#dde3ea}.xfail{background:#e4d2f3}.uncovered{background:#fff;border:1px dashed #999}
.untestable{background:#eee;color:#666}.not-reached{background:#fff;border:1px dotted #b08a2e;color:#7a5c10}
.msg{font-family:monospace;font-size:.85em;color:#900;white-space:pre-wrap}
.meta td:first-child{font-weight:600;width:12em}
.nid{font-family:monospace;font-size:.85em}
.prov{display:inline-block;padding:0 .4em;border-radius:3px;background:#fde7c4;font-size:.85em}
"""


def _badge(verdict: str) -> str:
    return f'<span class="v {escape(verdict)}">{escape(verdict)}</span>'


def _link(evidence: str | None, evidence_base: str | None) -> str:
    if not evidence:
        return ""
    href = evidence if evidence_base is None else os.path.join(evidence_base, evidence)
    return f' <a href="{escape(href.replace(os.sep, "/"))}">evidence</a>'


def _instance(t: Mapping[str, Any], evidence_base: str | None) -> str:
    line = f'{_badge(t["verdict"])} <span class="nid">{escape(t["nodeid"])}</span>'
    line += _link(t.get("evidence"), evidence_base)
    if t["verdict"] != "pass" and t.get("message"):
        line += f'<div class="msg">{escape(t["message"])}</div>'
    return f"<div>{line}</div>"


def _tests_cell(tests: list[Mapping[str, Any]], evidence_base: str | None) -> str:
    """One line per check function with its verdict counts; every instance that did not pass is shown
    with its message, the passing ones fold into a details element (parametrised checks run many)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for t in tests:
        groups.setdefault(t["nodeid"].split("[", 1)[0], []).append(t)
    parts = []
    for func, items in groups.items():
        counts: dict[str, int] = {}
        for t in items:
            counts[t["verdict"]] = counts.get(t["verdict"], 0) + 1
        badges = " ".join(f"{_badge(v)}{'' if n == 1 else f' ×{n}'}" for v, n in sorted(counts.items()))
        head = f'<div>{badges} <span class="nid">{escape(func)}</span></div>'
        shown = [_instance(t, evidence_base) for t in items if t["verdict"] != "pass"]
        passed = [_instance(t, evidence_base) for t in items if t["verdict"] == "pass"]
        if len(items) == 1 and passed:
            head = passed[0]
            passed = []
        folded = (f"<details><summary>{len(passed)} passing</summary>{''.join(passed)}</details>"
                  if passed else "")
        parts.append(head + "".join(shown) + folded)
    return "".join(parts)


def _problems(doc: Mapping[str, Any], evidence_base: str | None) -> list[str]:
    """The checks that did not pass, first on the page: what a reader looks for."""
    bad = [t for t in doc.get("tests", []) if t.get("verdict") in ("fail", "inconclusive")]
    if not bad:
        return []
    # A failure of a check that rests on a provisional profile may be the profile's, not the implementation's.
    depends = {r["id"]: r.get("depends_on", []) for p in doc.get("protocols", {}).values()
               for role in p.get("roles", {}).values() for r in role.get("requirements", [])}
    out = [f"<h2>Failed and inconclusive checks ({len(bad)})</h2><table><tr><th>verdict</th><th>check</th>"
           "<th>requirement</th><th>message</th></tr>"]
    # Failures first (the requirement each blames), then what could not be judged.
    for t in sorted(bad, key=lambda t: t.get("verdict") != "fail"):
        msg = str(t.get("message", "")).strip()
        # A failure blames the one requirement its failing assertion named; an inconclusive check, all it cites.
        reqs = [t["blamed"]] if t.get("blamed") else list(t.get("reqs", []))
        profiles = sorted({p for rid in reqs for p in depends.get(rid, [])})
        marks = "".join(f"<br><span class='prov'>depends on {escape(p)}</span>" for p in profiles)
        out.append(f"<tr><td>{_badge(t['verdict'])}</td><td class='nid'>{escape(t['nodeid'])}"
                   f"{_link(t.get('evidence'), evidence_base)}</td>"
                   f"<td class='nid'>{escape(' '.join(reqs))}{marks}</td>"
                   f"<td class='msg'>{escape(msg)}</td></tr>")
    out.append("</table>")
    return out


def render_html(doc: Mapping[str, Any], evidence_base: str | None = None) -> str:
    """The page for a coverage document; evidence links are prefixed with ``evidence_base``."""
    meta = doc.get("meta", {})
    summary = doc.get("summary", {})
    target = meta.get("target") or {}
    exit_code = meta.get("exit_code")
    status = "PASSED" if exit_code == 0 else f"FAILED (exit {exit_code})"
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>kvconform coverage: {escape(str(target.get('name', '?')))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>kvconform conformance report — {escape(status)}</h1>",
        "<table class='meta'>",
    ]
    rows = [
        ("target", f"{target.get('name', '?')} ({target.get('kind', '?')})"),
        ("testbed", str(meta.get("testbed", ""))),
        ("PICS source", str(target.get("pics_source", ""))),
        ("seed", str(meta.get("seed", ""))),
        ("strict", str(meta.get("strict", False))),
        ("started / finished", f"{meta.get('started', '')} / {meta.get('finished', '')}"),
        ("command", " ".join(meta.get("command_line", []))),
        ("versions", ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items())),
    ]
    out += [f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in rows]
    counts = " ".join(f"{_badge(v)} {n}" for v, n in summary.get("verdicts", {}).items())
    out.append(f"<tr><td>tests ({summary.get('tests', 0)})</td><td>{counts}</td></tr>")
    provisional = summary.get("provisional", {})
    if provisional:
        per = ", ".join(f"{n} on {p}" for p, n in provisional.items())
        out.append(f"<tr><td>provisional profiles</td><td>{escape(per)} "
                   "(verdicts that rest on a stand-in profile, not on the spec texts alone)</td></tr>")
    out.append("</table>")
    out += _problems(doc, evidence_base)

    for proto, pdoc in doc.get("protocols", {}).items():
        out.append(f"<h2>{escape(proto)} — {escape(pdoc.get('title', ''))}</h2>")
        for role, rdoc in pdoc.get("roles", {}).items():
            suites = ", ".join(rdoc.get("suites", [])) or "no suite"
            ran = "" if rdoc.get("ran") else " — not run"
            rc = " ".join(f"{_badge(v)} {n}" for v, n in rdoc.get("counts", {}).items())
            if rdoc.get("ran"):
                out.append(f"<h3>role {escape(role)} ({escape(suites)})</h3><p>{rc}</p>")
            else:  # a role whose suites did not run: folded, it only lists requirements
                out.append(f"<details><summary><b>role {escape(role)} ({escape(suites)}){escape(ran)}</b>: "
                           f"{len(rdoc.get('requirements', []))} requirements</summary>")
            out.append("<table><tr><th>id</th><th>level</th><th>section</th><th>requirement</th>"
                       "<th>verdict</th><th>tests</th></tr>")
            for req in rdoc.get("requirements", []):
                text = escape(req["text"])
                if req.get("why"):
                    text += f"<br><i>untestable: {escape(req['why'])}</i>"
                for profile in req.get("depends_on", []):
                    text += f"<br><span class='prov'>depends on {escape(profile)}</span>"
                out.append(
                    f"<tr><td class='nid'>{escape(req['id'])}</td><td>{escape(req['level'])}</td>"
                    f"<td>{escape(req['section'])}</td><td>{text}</td><td>{_badge(req['verdict'])}</td>"
                    f"<td>{_tests_cell(req.get('tests', []), evidence_base)}</td></tr>"
                )
            out.append("</table>")
            uncovered = rdoc.get("uncovered", [])
            listed = ", ".join(escape(i) for i in uncovered) if uncovered else "none"
            out.append(f"<p><b>Uncovered ({len(uncovered)}):</b> {listed}</p>")
            not_reached = rdoc.get("not_reached", [])
            if not_reached:
                out.append(f"<p><b>Cited but not reached ({len(not_reached)}):</b> "
                           f"{', '.join(escape(i) for i in not_reached)} (no assertion of a check evaluated them)</p>")
            if not rdoc.get("ran"):
                out.append("</details>")
    unknown = doc.get("unknown_requirements", [])
    if unknown:
        out.append(f"<p><b>Cited ids missing from the catalogs:</b> {escape(', '.join(unknown))}</p>")
    out.append("</body></html>\n")
    return "\n".join(out)


def write_html(doc: Mapping[str, Any], path: str | Path, report_dir: str | Path | None = None) -> Path:
    """Write the page; evidence links are made relative to the page from ``report_dir``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    base: str | None = None
    if report_dir is not None:
        base = os.path.relpath(os.path.abspath(report_dir), os.path.abspath(out.parent))
        if base == ".":
            base = None
    out.write_text(render_html(doc, base), "utf-8")
    return out
