"""Evidence a person can read: whole bytes (inline, or in the test's side file when large), one readable line per
event, the target's output, the PICS as a short summary, and a self-contained HTML view of it all."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kvconform import evidence
from kvconform.evidence import INLINE_BYTES, Transcript, pics_summary, raw_of, write_evidence
from kvconform.reports.evidence_html import EVENTS_SHOWN, hexdump, render_evidence_html, write_evidence_html
from kvconform.targets.process import TAIL, ProcessResult


def _bundle(t: Transcript, **extra: object) -> dict[str, object]:
    return {"nodeid": "tlkv/reader/test_x.py::test_y[a]", "verdict": "fail", "requirements": ["TLKV-READ-CRC"],
            "blamed": "TLKV-READ-CRC", "message": "TLKV-READ-CRC: crc: seen 1, expected 2",
            "assertion": {"requirement": "TLKV-READ-CRC", "what": "crc", "seen": "1", "expected": "2"},
            "transcript": t.lines(), "events": t.as_list(), **extra}


def test_bytes_are_kept_whole(tmp_path: Path) -> None:
    small, medium, large = b"\x01" * 100, bytes(range(256)) * 10, bytes(range(251)) * 100
    t = Transcript()
    t.record("sent", "small", raw=small)
    t.record("sent", "medium", raw=medium)
    t.record("received", "large", {"payload": large, "nested": [{"key": medium}]}, raw=large)
    events = t.as_list()
    assert "hex" not in events[0]["raw"] and raw_of(events[0]["raw"], None) == small
    assert len(medium) <= INLINE_BYTES and events[1]["raw"]["hex"] == medium.hex()
    assert "offset" in events[2]["raw"] and "hex" not in events[2]["raw"], "a large value goes to the side file"
    assert events[2]["fields"]["nested"][0]["key"]["hex"] == medium.hex(), "bytes among the fields are whole too"
    path = write_evidence(tmp_path / "evidence" / "t.json", _bundle(t), t.side_bytes())
    doc = json.loads(path.read_text())
    side = (path.parent / doc["side_file"]).read_bytes()
    assert doc["side_file"] == "t.bin" and len(side) == 2 * len(large)
    assert raw_of(doc["events"][2]["raw"], side) == large
    assert raw_of(doc["events"][2]["fields"]["payload"], side) == large
    assert raw_of(doc["events"][2]["raw"], None) is None, "without the side file the bytes are not made up"


def test_past_the_budget_the_bytes_are_summarised_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evidence, "BYTE_BUDGET", 6000)
    t = Transcript()
    t.record("sent", "one", raw=b"a" * 5000)
    t.record("sent", "two", raw=b"b" * 5000)
    first, second = (e["raw"] for e in t.as_list())
    assert "offset" in first and "offset" not in second
    assert "not kept" in second["cut"] and second["sha256"] == hashlib.sha256(b"b" * 5000).hexdigest()
    assert second["head_hex"] == (b"b" * 256).hex()


def test_one_readable_line_per_event() -> None:
    t = Transcript()
    t.record("sent", "envelope", {"version": 1, "magic": "544c4b56"}, raw=b"TLKV" + bytes(60))
    t.record("received", "import-outcome", {"status": "ok", "long": "x" * 500})
    t.note("the reader accepted it")
    lines = t.lines()
    assert lines[0].endswith("→ envelope: version=1 magic=544c4b56 [64 bytes, sha256 "
                             + hashlib.sha256(b"TLKV" + bytes(60)).hexdigest()[:16] + "…]")
    assert "← import-outcome: status=ok long=" in lines[1] and len(lines[1]) < 200, "long values are shortened"
    assert lines[2].endswith("· note: text=the reader accepted it")
    assert t.lines(limit=1)[1] == "... 2 more events (all of them under 'events')"


def test_process_output_is_kept_whole_when_long() -> None:
    short = ProcessResult(("tool",), 0, b"ok\n", b"", 0.1)
    assert "stdout_bytes" not in short.evidence()
    long = ProcessResult(("tool",), 3, b"x" * (TAIL + 10), b"warn\n", 0.1)
    ev = long.evidence()
    assert ev["stdout_bytes"] == b"x" * (TAIL + 10) and "stderr_bytes" not in ev
    t = Transcript()
    t.record("received", "reader process", ev)
    recorded = t.as_list()[0]["fields"]["stdout_bytes"]
    assert raw_of(recorded, t.side_bytes()) == b"x" * (TAIL + 10)


def test_pics_summary_is_the_roles_own_values() -> None:
    pics = {"tlkv": {"reader": {"versions": [1], "geometry": {"n_layers": 3}}, "writer": {"versions": [1]}},
            "kbtp": {"target": {"quota": 2}}}
    summary = pics_summary(pics, ["tlkv.reader.versions", "kbtp.target.quota"], "testbed defaults", "tlkv-reader")
    assert summary["values"] == {"tlkv.reader.versions": [1], "tlkv.reader.geometry.n_layers": 3}
    assert summary["defaulted"] == ["tlkv.reader.versions"] and summary["source"] == "testbed defaults"
    assert pics_summary(pics, [], "", "demo-reader")["values"] == {}


def test_hexdump() -> None:
    assert hexdump(b"TLKV\x00\x01") == "00000000  54 4c 4b 56 00 01" + " " * 30 + "  |TLKV..|"
    assert hexdump(bytes(17)).splitlines()[1].startswith("00000010  00 ")


def test_the_evidence_page_reads_first_and_holds_everything(tmp_path: Path) -> None:
    large = bytes(range(256)) * 40
    t = Transcript()
    t.record("sent", "envelope", {"version": 2}, raw=b"TLKV" + bytes(300))
    t.record("received", "reader process", ProcessResult(("tool", "--in", "x"), 1, b"out line\n", b"err <b>\n",
                                                         0.2).evidence())
    t.record("received", "big", raw=large)
    json_path = write_evidence(tmp_path / "evidence" / "c.json", _bundle(t, traceback="Traceback: boom"),
                               t.side_bytes())
    bundle = json.loads(json_path.read_text())
    page_path = write_evidence_html(json_path, bundle, tmp_path)
    page = page_path.read_text()
    assert page_path.name == "c.html"
    assert "<script" not in page and "http://" not in page and "https://" not in page, "self-contained"
    assert "href='../coverage.html'" in page and "href='c.json'" in page
    assert page.index("TLKV-READ-CRC: crc: seen 1, expected 2") < page.index("id='transcript'") < page.index(
        "id='context'"), "verdict and message first, context last"
    assert "<th>seen</th><td><code>1</code>" in page and "<th>expected</th><td><code>2</code>" in page
    assert "→ sent to the target" in page and "← received from the target" in page
    assert "00000000  54 4c 4b 56 00 00" in page, "the bytes as a hex dump"
    assert "<summary>all 304 bytes</summary>" in page
    assert "id='output'" in page and "out line" in page and "err &lt;b&gt;" in page, "the target's output"
    assert "href='c.bin'" in page and f"{len(large)} bytes" in page, "a large value links the side file"
    assert "Traceback: boom" in page
    many = Transcript()
    for i in range(EVENTS_SHOWN + 5):
        many.record("sent", "n", {"i": i})
    assert f"The first {EVENTS_SHOWN} of {EVENTS_SHOWN + 5} events are shown" in render_evidence_html(_bundle(many))
