"""A check's evidence as a page a person reads: verdict and message, the failed assertion, the transcript (what
was sent, what came back, decoded, with the bytes as a hex dump), the target's output, then the context.

Written beside the evidence JSON (``evidence/<check>.html``) by the plugin; the certification report links to it.
Self-contained: inline CSS, no scripts, no external fetches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from html import escape
from pathlib import Path
from typing import Any

from kvconform.evidence import raw_of

__all__ = ["EVENTS_SHOWN", "hexdump", "render_evidence_html", "write_evidence_html"]

EVENTS_SHOWN = 2000  # events a page shows (the JSON keeps all)
_DUMP_LIMIT = 16 << 10  # bytes of one value a page dumps whole (the side file keeps all)
_HEAD = 256

CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:110em}
h1{font-size:1.3em;word-break:break-all}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;width:100%;margin:.4em 0 1em}
th,td{border:1px solid #ccc;padding:.2em .4em;vertical-align:top;font-size:.88em;text-align:left}
th{background:#f0f0f0}
.v{display:inline-block;padding:0 .4em;border-radius:3px;font-weight:600}
.pass{background:#c8f0c8}.fail{background:#f7b6b6}.inconclusive{background:#f7dc9c}
.not-applicable{background:#dde3ea}.xfail{background:#e4d2f3}
pre{font-family:monospace;font-size:.85em;white-space:pre-wrap;margin:.2em 0}
pre.msg{color:#900}pre.dump{white-space:pre;overflow-x:auto;background:#f8f8f8;padding:.3em}
.sent{color:#04589c}.received{color:#0b6b1f}.note{color:#666}
.f{margin:0 0 .1em 0}.f pre{margin-left:1em}
"""

_DIRECTION = {"sent": "→ sent to the target", "received": "← received from the target", "note": "· note"}


def hexdump(data: bytes) -> str:
    """``offset  hex octets  |ascii|``, 16 octets a line."""
    lines = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<47}  |{text}|")
    return "\n".join(lines)


def _is_bytes(value: Any) -> bool:
    return isinstance(value, Mapping) and "sha256" in value and "len" in value and "head_hex" in value


def _bytes_html(value: Mapping[str, Any], side: bytes | None, side_name: str | None) -> str:
    n = int(value.get("len", 0))
    whole = raw_of(value, side)
    head = bytes.fromhex(str(value.get("head_hex", "")))
    out = [f"<div>{n} bytes, sha256 <code>{escape(str(value.get('sha256', '')))}</code></div>"]
    if whole is not None and n <= _HEAD:
        out.append(f"<pre class='dump'>{escape(hexdump(whole))}</pre>")
        return "".join(out)
    out.append(f"<pre class='dump'>{escape(hexdump(head))}</pre>")
    if whole is not None and n <= _DUMP_LIMIT:
        out.append(f"<details><summary>all {n} bytes</summary><pre class='dump'>{escape(hexdump(whole))}</pre>"
                   "</details>")
    if "offset" in value and side_name:
        out.append(f"<div>whole: <a href='{escape(side_name)}'>{escape(side_name)}</a>, offset {value['offset']}, "
                   f"{n} bytes</div>")
    if "cut" in value:
        out.append(f"<div><i>{escape(str(value['cut']))}</i></div>")
    return "".join(out)


def _value_html(value: Any, side: bytes | None, side_name: str | None) -> str:
    if _is_bytes(value):
        return _bytes_html(value, side, side_name)
    if isinstance(value, str) and value:
        return f"<pre>{escape(value)}</pre>" if "\n" in value or len(value) > 100 else escape(value)
    return f"<code>{escape(json.dumps(value, default=str))}</code>"


def _fields_html(fields: Any, side: bytes | None, side_name: str | None) -> str:
    if not isinstance(fields, Mapping):
        return _value_html(fields, side, side_name)
    return "".join(f"<div class='f'><b>{escape(str(k))}</b> {_value_html(v, side, side_name)}</div>"
                   for k, v in fields.items())


def _badge(verdict: str) -> str:
    return f'<span class="v {escape(verdict)}">{escape(verdict)}</span>'


def _rows(rows: list[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _capture_html(capture: Any) -> list[str]:
    """What crossed the wire (``--capture``): links to the pcap, qlog and key log beside this page."""
    if not isinstance(capture, Mapping):
        return []
    out = ["<h2 id='capture'>Capture</h2>"]
    files = [f for f in capture.get("files", []) if isinstance(f, Mapping) and f.get("path")]
    if not capture.get("kept") or not files:
        why = "; ".join(map(str, capture.get("notes", []))) or f"not kept (--capture {capture.get('mode', '?')})"
        return [*out, f"<p>{escape(why)}</p>"]
    rows = [(escape(str(f.get("kind", "file"))),
             f"<a href='{escape(str(f['path']))}'>{escape(str(f['path']))}</a>"
             + (f" ({escape(str(f['packets']))} packets)" if "packets" in f else "")) for f in files]
    out.append(_rows(rows))
    out += [f"<p>Open it: <code>{escape(str(f['open']))}</code></p>" for f in files if f.get("open")]
    out += [f"<p>{escape(str(n))}</p>" for n in capture.get("notes", [])]
    return out


def render_evidence_html(bundle: Mapping[str, Any], side: bytes | None = None, *, json_name: str | None = None,
                         report_href: str | None = None) -> str:
    """The page of one evidence bundle; ``side``: its side file's bytes; links to the JSON and the report."""
    side_name = bundle.get("side_file")
    verdict = str(bundle.get("verdict", "?"))
    out = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
           f"<title>kvconform evidence: {escape(str(bundle.get('nodeid', '')))}</title>",
           f"<style>{CSS}</style></head><body>"]
    links = []
    if report_href:
        links.append(f"<a href='{escape(report_href)}'>← certification report</a>")
    if json_name:
        links.append(f"<a href='{escape(json_name)}'>evidence JSON</a>")
    if links:
        out.append("<p>" + " · ".join(links) + "</p>")
    out.append(f"<h1 id='check'>{_badge(verdict)} {escape(str(bundle.get('nodeid', '')))}</h1>")
    reqs = " ".join(bundle.get("requirements", []))
    rows = [("verdict", _badge(verdict)), ("requirements cited", escape(reqs))]
    if bundle.get("blamed"):
        rows.append(("requirement broken", f"<b>{escape(str(bundle['blamed']))}</b>"))
    if bundle.get("message"):
        rows.append(("message", f"<pre class='msg' id='message'>{escape(str(bundle['message']))}</pre>"))
    assertion = bundle.get("assertion")
    if isinstance(assertion, Mapping):
        rows += [("field", escape(str(assertion.get("what", "")))),
                 ("seen", f"<code>{escape(str(assertion.get('seen')))}</code>"),
                 ("expected", f"<code>{escape(str(assertion.get('expected')))}</code>")]
    out.append(_rows(rows))

    events = list(bundle.get("events", []))
    out.append(f"<h2 id='transcript'>Transcript ({len(events)} events)</h2>")
    if not events:
        out.append("<p>The check recorded no exchange with the target.</p>")
    else:
        out.append("<table><tr><th>#</th><th>t (s)</th><th>direction</th><th>what</th><th>decoded</th>"
                   "<th>bytes</th></tr>")
        for i, e in enumerate(events[:EVENTS_SHOWN]):
            direction = str(e.get("direction", ""))
            raw = e.get("raw")
            out.append(f"<tr class='{escape(direction)}'><td>{i}</td><td>{float(e.get('t', 0)):.6f}</td>"
                       f"<td>{escape(_DIRECTION.get(direction, direction))}</td><td>{escape(str(e.get('kind')))}</td>"
                       f"<td>{_fields_html(e.get('fields'), side, side_name)}</td>"
                       f"<td>{_bytes_html(raw, side, side_name) if isinstance(raw, Mapping) else ''}</td></tr>")
        out.append("</table>")
        if len(events) > EVENTS_SHOWN:
            out.append(f"<p>The first {EVENTS_SHOWN} of {len(events)} events are shown; the evidence JSON holds all."
                       "</p>")

    outputs = [e for e in events if isinstance(e.get("fields"), Mapping)
               and ("stdout" in e["fields"] or "stderr" in e["fields"])]
    if outputs:
        out.append("<h2 id='output'>Target output</h2>")
        for e in outputs:
            f = e["fields"]
            out.append(f"<h3>{escape(str(e.get('kind')))}: exit {escape(str(f.get('returncode')))}</h3>")
            if f.get("argv"):
                out.append(f"<pre>{escape(' '.join(map(str, f['argv'])))}</pre>")
            for name in ("stdout", "stderr"):
                out.append(f"<div><b>{name}</b></div><pre class='dump'>{escape(str(f.get(name, '')))}</pre>")

    out += _capture_html(bundle.get("capture"))

    if bundle.get("traceback"):
        out.append(f"<h2 id='traceback'>Traceback</h2><pre class='dump'>{escape(str(bundle['traceback']))}</pre>")

    out.append("<h2 id='context'>Context</h2>")
    target = bundle.get("target") or {}
    impl = target.get("implementation") or {}
    ctx = [("seed (this check)", escape(str(bundle.get("seed")))),
           ("session seed", escape(str(bundle.get("session_seed")))),
           ("target", escape(f"{target.get('name', '?')} ({target.get('kind', '?')})")),
           ("implementation", escape(", ".join(f"{k} {v}" for k, v in impl.items()) or "not declared"))]
    pics = bundle.get("pics") or {}
    if isinstance(pics, Mapping) and "values" in pics:
        defaulted = set(pics.get("defaulted", []))
        lines = "".join(f"<tr><td><code>{escape(p)}</code></td><td><code>{escape(json.dumps(v, default=str))}"
                        f"</code></td><td>{'defaulted' if p in defaulted else 'declared'}</td></tr>"
                        for p, v in pics["values"].items())
        ctx.append(("PICS", f"<div>{escape(str(pics.get('source', '')))}</div><table>{lines}</table>"
                            f"<div>{escape(str(pics.get('all', '')))}</div>"))
    ctx.append(("versions", escape(", ".join(f"{k} {v}" for k, v in (bundle.get("versions") or {}).items()))))
    out.append(_rows(ctx))
    out.append("</body></html>\n")
    return "\n".join(out)


def write_evidence_html(json_path: Path, bundle: Mapping[str, Any], report_dir: str | os.PathLike[str] | None,
                        ) -> Path:
    """Write ``<check>.html`` beside the evidence JSON ``json_path`` (reading its side file when there is one)."""
    out = json_path.with_suffix(".html")
    side_name = bundle.get("side_file") or (json_path.with_suffix(".bin").name
                                            if json_path.with_suffix(".bin").is_file() else None)
    side = (json_path.parent / side_name).read_bytes() if side_name else None
    report_href = None
    if report_dir is not None:
        report_href = os.path.relpath(os.path.join(report_dir, "coverage.html"), json_path.parent)
    page = render_evidence_html({**bundle, "side_file": side_name}, side, json_name=json_path.name,
                                report_href=report_href.replace(os.sep, "/") if report_href else None)
    out.write_text(page, "utf-8")
    return out
