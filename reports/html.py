"""The certification report as one self-contained HTML page (inline CSS, no scripts, no external fetches).

Top to bottom: the verdict headline and the per-role counts; the Identity block (implementation under test,
testbed, declared PICS values with the defaulted ones marked, spec texts and catalogs by SHA-256, harness
version and commit, the command to replay, seeds, times, host); the failed, then the inconclusive requirements
with every check's whole message, the failed assertion (field, seen, expected) and links to its evidence; then
every requirement per protocol and role, failing first.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from kvconform.reports.certification import CATEGORIES, certify

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:120em}
h1{font-size:1.4em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1.05em}
table{border-collapse:collapse;width:100%;margin:.5em 0 1em}
th,td{border:1px solid #ccc;padding:.25em .45em;vertical-align:top;font-size:.9em;text-align:left}
th{background:#f0f0f0}
.v{display:inline-block;padding:0 .4em;border-radius:3px;font-weight:600;white-space:nowrap}
.pass{background:#c8f0c8}.fail{background:#f7b6b6}.inconclusive{background:#f7dc9c}
.not-applicable{background:#dde3ea}.xfail{background:#e4d2f3}.uncovered{background:#fff;border:1px dashed #999}
.untestable{background:#eee;color:#666}.not-reached{background:#fff;border:1px dotted #b08a2e;color:#7a5c10}
.headline{font-size:1.25em;font-weight:700;padding:.5em .7em;border-radius:4px;margin:.5em 0}
.headline.PASSED{background:#c8f0c8}.headline.FAILED{background:#f7b6b6}
.headline.NOT-CERTIFIABLE{background:#f7dc9c}
.msg{font-family:monospace;font-size:.85em;color:#900;white-space:pre-wrap;margin:.2em 0}
.kv th{width:14em;background:#f7f7f7}
.nid,code{font-family:monospace;font-size:.85em;word-break:break-all}
.prov{display:inline-block;padding:0 .4em;border-radius:3px;background:#fde7c4;font-size:.85em}
.defaulted{color:#7a5c10;font-style:italic}.untested td{color:#888}
.req{border:1px solid #ccc;border-left:6px solid #999;padding:.3em .7em;margin:.6em 0}
.req.fail{border-left-color:#c22;background:#fff}.req.inconclusive{border-left-color:#d49a00;background:#fff}
.assert th{width:7em}.zero{color:#bbb}
"""

_HEADINGS = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive", "not-applicable": "not applicable",
             "not-reached": "not reached", "uncovered": "uncovered", "untestable": "untestable", "xfail": "xfail"}
_TABLE_ORDER = ("pass", "fail", "inconclusive", "not-applicable", "not-reached", "uncovered", "untestable", "xfail")


def _badge(verdict: str) -> str:
    return f'<span class="v {escape(verdict)}">{escape(verdict)}</span>'


def _href(path: str, base: str | None) -> str:
    href = path if base is None or os.path.isabs(path) else os.path.join(base, path)
    return escape(href.replace(os.sep, "/"))


def _links(t: Mapping[str, Any], base: str | None) -> str:
    out = []
    if t.get("evidence_html"):
        out.append(f'<a class="evidence" href="{_href(t["evidence_html"], base)}">evidence</a>')
    if t.get("evidence"):
        label = "json" if t.get("evidence_html") else "evidence"
        out.append(f'<a class="evidence-json" href="{_href(t["evidence"], base)}">{label}</a>')
    return (" " + " · ".join(out)) if out else ""


def _assertion(t: Mapping[str, Any]) -> str:
    a = t.get("assertion")
    if not isinstance(a, Mapping):
        return ""
    rows = [("field", a.get("what")), ("seen", a.get("seen")), ("expected", a.get("expected"))]
    return ("<table class='assert'>" + "".join(f"<tr><th>{k}</th><td><code>{escape(str(v))}</code></td></tr>"
                                               for k, v in rows if v is not None) + "</table>")


def _instance(t: Mapping[str, Any], base: str | None) -> str:
    line = f'{_badge(t["verdict"])} <span class="nid">{escape(t["nodeid"])}</span>{_links(t, base)}'
    if t["verdict"] != "pass" and t.get("message"):
        line += f'<div class="msg">{escape(t["message"])}</div>' + _assertion(t)
    return f"<div class='check'>{line}</div>"


def _tests_cell(tests: list[Mapping[str, Any]], base: str | None) -> str:
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
        shown = [_instance(t, base) for t in items if t["verdict"] != "pass"]
        passed = [_instance(t, base) for t in items if t["verdict"] == "pass"]
        if len(items) == 1 and passed:
            head = passed[0]
            passed = []
        folded = (f"<details><summary>{len(passed)} passing</summary>{''.join(passed)}</details>"
                  if passed else "")
        parts.append(head + "".join(shown) + folded)
    return "".join(parts)


def _kv(rows: list[tuple[str, str]]) -> str:
    return "<table class='kv'>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _sha(value: Any) -> str:
    return f"<code>{escape(str(value))}</code>" if value else "<i>not available</i>"


def _pics_table(values: list[Mapping[str, Any]]) -> str:
    rows, group = [], None
    for v in values:
        head = ".".join(str(v["path"]).split(".")[:2])
        if head != group:
            group = head
            rows.append(f"<tr><th colspan='3'>{escape(head)}</th></tr>")
        origin = ("set by --pics-set" if v.get("overridden") else
                  "<span class='defaulted'>defaulted</span>" if v.get("defaulted") else "declared")
        cls = " class='defaulted'" if v.get("defaulted") else ""
        rows.append(f"<tr{cls} data-pics='{escape(str(v['path']))}'><td><code>{escape(str(v['path']))}</code></td>"
                    f"<td><code>{escape(json.dumps(v['value'], default=str))}</code></td><td>{origin}</td></tr>")
    return "<table class='pics'><tr><th>PICS</th><th>value</th><th>origin</th></tr>" + "".join(rows) + "</table>"


def _identity(doc: Mapping[str, Any]) -> list[str]:
    ident = doc.get("identity") or {}
    out = ["<section id='identity'><h2>Identity</h2>"]
    if not ident:
        meta = doc.get("meta", {})
        out.append("<p>Not recorded (a coverage.json written by an older kvconform). Seed "
                   f"{escape(str(meta.get('seed', '?')))}, testbed {escape(str(meta.get('testbed', '?')))}.</p>")
        return [*out, "</section>"]
    impl = dict(ident.get("implementation") or {})
    out.append("<h3>Implementation under test</h3>")
    if impl.pop("declared", False):
        out.append(_kv([(k, escape(str(impl.get(k, "—")))) for k in ("name", "vendor", "version", "build",
                                                                        "firmware")]
                       + ([("description", escape(str(impl["description"])))] if impl.get("description") else [])))
    else:
        out.append(f"<p class='defaulted'>{escape(str(impl.get('note', 'not declared')))}</p>")
    target = ident.get("target") or {}
    roles = target.get("roles")
    out.append(_kv([("target", f"<code>{escape(str(target.get('name')))}</code> ({escape(str(target.get('kind')))})"),
                    ("plays", escape(", ".join(roles)) if roles else "every suite")]))
    bed = ident.get("testbed") or {}
    out.append("<h3>Testbed</h3>")
    out.append(_kv([("name", escape(str(bed.get("name")))), ("file", f"<code>{escape(str(bed.get('file')))}</code>"),
                    ("SHA-256", _sha(bed.get("sha256")))]))
    pics = ident.get("pics") or {}
    values = pics.get("values", [])
    out.append(f"<h3 id='pics'>Declared PICS ({len(values)} values, {pics.get('defaulted', 0)} defaulted)</h3>")
    out.append(f"<p>Source: {escape(str(pics.get('source', '')))}. <span class='defaulted'>defaulted</span>: not "
               "declared for this target, taken from the testbed's defaults (which claim only mandatory "
               "behaviour).</p>")
    # The values of the roles this run tested first; the rest folded (they decided nothing here).
    used = {".".join(s.split("-", 1)) for s in (ident.get("run") or {}).get("suites", [])}
    mine = [v for v in values if ".".join(str(v["path"]).split(".")[:2]) in used]
    others = [v for v in values if v not in mine]
    out.append(_pics_table(mine or values))
    if mine and others:
        out.append(f"<details><summary>{len(others)} more PICS values, of roles this run did not test</summary>"
                   f"{_pics_table(others)}</details>")
    out.append("<h3>Specification texts and requirement catalogs</h3><table><tr><th>protocol</th><th>spec text</th>"
               "<th>SHA-256</th><th>catalog</th><th>SHA-256</th></tr>")
    for s in ident.get("specs", []):
        text, cat = s.get("text") or {}, s.get("catalog") or {}
        out.append(f"<tr><td>{escape(str(s.get('protocol')))}</td><td><code>{escape(str(text.get('name')))}</code>"
                   f"</td><td>{_sha(text.get('sha256'))}</td><td><code>{escape(str(cat.get('name')))}</code></td>"
                   f"<td>{_sha(cat.get('sha256'))}</td></tr>")
    out.append("</table>")
    harness, run, host = ident.get("harness") or {}, ident.get("run") or {}, ident.get("host") or {}
    out.append("<h3>Harness and run</h3>")
    versions = ", ".join(f"{k} {v}" for k, v in (harness.get("versions") or {}).items())
    out.append(_kv([
        ("harness", escape(f"{harness.get('name', 'kvconform')} {harness.get('version', '?')}")),
        ("commit", f"<code>{escape(str(harness.get('commit', 'unknown')))}</code>"),
        ("command", f"<code id='command'>{escape(str(run.get('command', '')))}</code>"
                    + ("" if run.get("replayable") else " <i>(pytest's own command line)</i>")),
        ("working folder", f"<code>{escape(str(run.get('cwd', '')))}</code>"),
        ("suites", escape(", ".join(run.get("suites", [])))),
        ("seed", f"<code>{escape(str(run.get('seed')))}</code> (replays with --seed)"),
        ("strict", escape(str(run.get("strict")))),
        ("sweep", escape(str(run.get("sweep", "boundary")))),
        ("started / finished", escape(f"{run.get('started')} / {run.get('finished')}")),
        ("exit status", escape(str(run.get("exit_code")))),
        ("host", escape(f"{host.get('name')} ({host.get('platform')}, {host.get('cpus')} CPUs)")),
        ("versions", escape(versions)),
    ]))
    return [*out, "</section>"]


def _roles_table(doc: Mapping[str, Any]) -> list[str]:
    out = ["<table id='roles'><tr><th>protocol</th><th>role</th><th>suites</th>"
           + "".join(f"<th>{_HEADINGS[c]}</th>" for c in _TABLE_ORDER) + "</tr>"]
    for r in doc.get("roles_summary", []):
        counts = r.get("counts", {})
        suites = escape(", ".join(r.get("suites", [])) or "no suite")
        if r.get("tested"):
            cls = ""
            cells = "".join(f"<td class='{'zero' if not counts.get(c) else ''}'>{counts.get(c, 0)}</td>"
                            for c in _TABLE_ORDER)
        else:  # counts of a role nothing tested would read as a verdict on it
            cls = " class='untested'"
            cells = (f"<td colspan='{len(_TABLE_ORDER)}'>not tested in this run ({sum(counts.values())} "
                     "requirements)</td>")
        out.append(f"<tr{cls} data-role='{escape(r['protocol'])} {escape(r['role'])}'><td>{escape(r['protocol'])}"
                   f"</td><td>{escape(r['role'])}</td><td>{suites}</td>{cells}</tr>")
    out.append("</table>")
    return out


def _requirements_by_id(doc: Mapping[str, Any]) -> dict[str, list[tuple[str, str, Mapping[str, Any]]]]:
    out: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for proto, pdoc in doc.get("protocols", {}).items():
        for role, rdoc in pdoc.get("roles", {}).items():
            if rdoc.get("tested", rdoc.get("ran")):
                for req in rdoc.get("requirements", []):
                    out.setdefault(req["id"], []).append((proto, role, req))
    return out


def _marks(req: Mapping[str, Any]) -> str:
    text = ""
    if req.get("why"):
        text += f"<br><i>untestable: {escape(req['why'])}</i>"
    for profile in req.get("depends_on", []):
        text += f"<br><span class='prov'>depends on {escape(profile)}</span>"
    return text


def _problem_blocks(doc: Mapping[str, Any], base: str | None) -> list[str]:
    """The failed, then the inconclusive requirements, each with the checks that judged it so."""
    by_id = _requirements_by_id(doc)
    out: list[str] = []
    for verdict, title in (("fail", "Failed requirements"), ("inconclusive", "Inconclusive requirements")):
        hits = [(rid, entries) for rid, entries in by_id.items() if any(r["verdict"] == verdict for _, _, r in entries)]
        if not hits:
            continue
        hits.sort(key=lambda h: (h[1][0][2].get("obligation") != "mandatory", h[0]))
        out.append(f"<section id='{verdict}'><h2>{title} ({len(hits)})</h2>")
        for rid, entries in hits:
            req = next(e[2] for e in entries if e[2]["verdict"] == verdict)
            roles = ", ".join(f"{p} {r}" for p, r, e in entries if e["verdict"] == verdict)
            tests = [t for _, _, e in entries if e["verdict"] == verdict for t in e.get("tests", [])
                     if t["verdict"] == verdict]
            seen: set[str] = set()
            checks = []
            for t in tests:
                if t["nodeid"] not in seen:
                    seen.add(t["nodeid"])
                    checks.append(_instance(t, base))
            out.append(f"<div class='req {verdict}' data-requirement='{escape(rid)}' data-verdict='{verdict}'>"
                       f"<h3>{_badge(verdict)} <span class='nid'>{escape(rid)}</span> — {escape(req['level'])} "
                       f"({escape(req.get('obligation', ''))}), {escape(roles)}</h3>"
                       f"<p>{escape(req['section'])}: {escape(req['text'])}{_marks(req)}</p>"
                       f"<div>{len(checks)} check{'s' if len(checks) != 1 else ''}:</div>{''.join(checks)}</div>")
        out.append("</section>")
    return out


def _role_tables(doc: Mapping[str, Any], base: str | None) -> list[str]:
    out = ["<section id='requirements'><h2>Verdict per requirement</h2>"]
    for proto, pdoc in doc.get("protocols", {}).items():
        out.append(f"<h2>{escape(proto)} — {escape(pdoc.get('title', ''))}</h2>")
        for role, rdoc in pdoc.get("roles", {}).items():
            suites = ", ".join(rdoc.get("suites", [])) or "no suite"
            tested = rdoc.get("tested", rdoc.get("ran"))
            counts = rdoc.get("summary") or rdoc.get("counts", {})
            rc = " ".join(f"{_badge(v)} {n}" for v, n in counts.items() if n)
            if tested:
                out.append(f"<h3>role {escape(role)} ({escape(suites)})</h3><p>{rc}</p>")
            else:  # a role no check of this run tested: folded, it only lists requirements
                out.append(f"<details><summary><b>role {escape(role)} ({escape(suites)}) — not tested in this run"
                           f"</b>: {len(rdoc.get('requirements', []))} requirements</summary>")
            out.append("<table><tr><th>id</th><th>level</th><th>section</th><th>requirement</th>"
                       "<th>verdict</th><th>checks</th></tr>")
            reqs = sorted(rdoc.get("requirements", []), key=lambda r: CATEGORIES.index(r["verdict"])
                          if r["verdict"] in CATEGORIES else len(CATEGORIES))
            for req in reqs:
                level = escape(req["level"]) + (f"<br><small>{escape(req['obligation'])}</small>"
                                                if req.get("obligation") else "")
                out.append(
                    f"<tr data-requirement='{escape(req['id'])}' data-verdict='{escape(req['verdict'])}'>"
                    f"<td class='nid'>{escape(req['id'])}</td><td>{level}</td>"
                    f"<td>{escape(req['section'])}</td><td>{escape(req['text'])}{_marks(req)}</td>"
                    f"<td>{_badge(req['verdict'])}</td><td>{_tests_cell(req.get('tests', []), base)}</td></tr>"
                )
            out.append("</table>")
            uncovered = rdoc.get("uncovered", [])
            listed = ", ".join(escape(i) for i in uncovered) if uncovered else "none"
            out.append(f"<p><b>Uncovered ({len(uncovered)}):</b> {listed}</p>")
            not_reached = rdoc.get("not_reached", [])
            if not_reached:
                out.append(f"<p><b>Cited but not reached ({len(not_reached)}):</b> "
                           f"{', '.join(escape(i) for i in not_reached)} (no assertion of a check evaluated them)</p>")
            if not tested:
                out.append("</details>")
    out.append("</section>")
    return out


def render_html(doc: Mapping[str, Any], evidence_base: str | None = None) -> str:
    """The page for a certification report (``certify``; a bare coverage document is certified here, without an
    identity); evidence links are prefixed with ``evidence_base``."""
    meta = doc.get("meta", {})
    if "verdict" not in doc:
        doc = certify(doc, doc.get("identity"), strict=bool(meta.get("strict")), exit_code=meta.get("exit_code"))
    headline = doc["verdict"]
    ident = doc.get("identity") or {}
    impl = (ident.get("implementation") or {})
    target = meta.get("target") or ident.get("target") or {}
    name = impl.get("name") if impl.get("declared") else target.get("name", "?")
    summary = doc.get("summary", {})
    out = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>kvconform certification report: {escape(str(name))} — {escape(headline['status'])}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>kvconform certification report: {escape(str(name))}"
        + (f" {escape(str(impl['version']))}" if impl.get("declared") and impl.get("version") else "") + "</h1>",
        f"<div id='headline' class='headline {escape(headline['status'].replace(' ', '-'))}'>"
        f"{escape(headline['text'])}</div>",
        f"<p>{headline.get('requirements', 0)} requirements of the roles tested; exit status "
        f"{escape(str(headline.get('exit_code')))}; {summary.get('tests', 0)} checks: "
        + " ".join(f"{_badge(v)} {n}" for v, n in summary.get("verdicts", {}).items()) + "</p>",
    ]
    provisional = summary.get("provisional", {})
    if provisional:
        per = ", ".join(f"{n} on {p}" for p, n in provisional.items())
        out.append(f"<p>Provisional profiles: {escape(per)} (verdicts that rest on a stand-in profile, not on the "
                   "spec texts alone)</p>")
    out += _roles_table(doc)
    out += _identity(doc)
    out += _problem_blocks(doc, evidence_base)
    out += _role_tables(doc, evidence_base)
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
