"""JUnit XML of a kvconform run: one ``<testsuite>`` per conformance suite, in the form CI systems read.

Written by the plugin on the controller from its own results (``--kvconform-junit FILE``; ``kvconform run``
writes ``<report-dir>/junit.xml``), not by rewriting pytest's ``--junitxml``: a check's outcome in the file is
its kvconform verdict, which pytest's outcome does not carry (a plain skip, a harness error, a target that
could not be reached are all judged by kvconform/policy.py), the grouping is by suite, and pytest's own file
stays what a project's ini makes of it. The structure is ``reports/schema/junit.xsd`` (junit-10 plus testcase
properties).

- fail -> ``<failure>``; inconclusive -> ``<error>`` (the check could not decide: a CI gate must not read it as
  skipped); a harness error -> ``<error type="kvconform.harness-error">``; not-applicable and xfail ->
  ``<skipped>``; a collection error -> an ``<error>`` test case of the suite ``collection``.
- Per test case, ``<properties>``: ``kvconform.verdict``, one ``kvconform.requirement`` per cited id,
  ``kvconform.requirements``, ``kvconform.blamed`` (a failure), ``kvconform.level``, ``kvconform.gating``,
  ``kvconform.seed``, ``kvconform.reached``, ``kvconform.nodeid`` and ``kvconform.evidence``: the evidence
  bundle's path relative to the JUnit file's folder, so the report directory can be moved as a whole.
- The failure element holds the whole message; its ``message`` attribute the first line, prefixed with the
  blamed requirement and its level.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvconform.policy import is_harness_error
from kvconform.results import TestResult
from kvconform.verdicts import Verdict, gates

__all__ = ["COLLECTION_SUITE", "SCHEMA", "junit_document", "outcome_of", "write_junit"]

SCHEMA = Path(__file__).parent / "schema" / "junit.xsd"
COLLECTION_SUITE = "collection"  # the <testsuite> of collection errors (no check of any suite ran there)
MESSAGE_ATTR_LIMIT = 500  # characters of the first line in a failure's message attribute
# Characters XML 1.0 cannot carry (a target's bytes in a message): written as \xNN.
_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: object) -> str:
    return _ILLEGAL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _timestamp(iso: str | None) -> str:
    """Jenkins reads a timestamp without a zone: ``YYYY-MM-DDTHH:MM:SS`` (UTC here)."""
    try:
        when = dt.datetime.fromisoformat(iso) if iso else dt.datetime.now(dt.UTC)
    except ValueError:
        when = dt.datetime.now(dt.UTC)
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S")


def _first_line(message: str) -> str:
    line = next((ln for ln in message.splitlines() if ln.strip()), "")
    return line if len(line) <= MESSAGE_ATTR_LIMIT else line[:MESSAGE_ATTR_LIMIT] + "..."


def relative_evidence(evidence: str | None, junit_dir: Path) -> str | None:
    """The evidence path relative to the folder of the JUnit file, with ``/`` separators."""
    if not evidence:
        return None
    rel = os.path.relpath(os.path.abspath(evidence), os.path.abspath(junit_dir))
    return rel.replace(os.sep, "/")


def outcome_of(r: TestResult) -> tuple[str, str] | None:
    """The JUnit element (``failure``, ``error``, ``skipped``) and its ``type`` for a result; None for a pass."""
    if r.verdict == Verdict.FAIL:
        return "failure", "kvconform.fail"
    if r.verdict == Verdict.INCONCLUSIVE:
        harness = is_harness_error(r.verdict, r.message)
        return "error", "kvconform.harness-error" if harness else "kvconform.inconclusive"
    if r.verdict == Verdict.NOT_APPLICABLE:
        return "skipped", "kvconform.not-applicable"
    if r.verdict == Verdict.XFAIL:
        return "skipped", "kvconform.xfail"
    if r.verdict == Verdict.PASS:
        return None
    return "error", f"kvconform.{r.verdict}"  # a verdict this writer does not know is never shown as a pass


def _names(r: TestResult, suite: str) -> tuple[str, str]:
    """(classname, name): ``<suite>.<module>[.<Class>]`` and the test's name with its parameters."""
    path, _, rest = r.nodeid.partition("::")
    parts = rest.split("::") if rest else [r.nodeid]
    module = Path(path).stem or "checks"
    return ".".join([suite, module, *parts[:-1]]), parts[-1]


def _properties(parent: ET.Element, pairs: Iterable[tuple[str, object]]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in pairs:
        ET.SubElement(props, "property", name=name, value=_text(value))


def _testcase(suite_el: ET.Element, r: TestResult, suite: str, junit_dir: Path, strict: bool,
              captured: Mapping[str, tuple[str, str]]) -> str | None:
    classname, name = _names(r, suite)
    case = ET.SubElement(suite_el, "testcase", name=_text(name), classname=_text(classname),
                         time=_seconds(r.duration))
    evidence = relative_evidence(r.evidence, junit_dir)
    gating = gates(r.level, strict=strict)
    pairs: list[tuple[str, object]] = [("kvconform.verdict", r.verdict)]
    pairs += [("kvconform.requirement", rid) for rid in r.reqs]
    pairs += [("kvconform.requirements", " ".join(r.reqs))]
    if r.verdict == Verdict.FAIL and r.blamed:
        pairs.append(("kvconform.blamed", r.blamed))
    pairs += [("kvconform.level", r.level or ""), ("kvconform.gating", "true" if gating else "false")]
    if r.seed is not None:
        pairs.append(("kvconform.seed", r.seed))
    if r.reached is not None:
        pairs.append(("kvconform.reached", " ".join(r.reached)))
    pairs.append(("kvconform.nodeid", r.nodeid))
    if evidence:
        pairs.append(("kvconform.evidence", evidence))
    _properties(case, pairs)
    outcome = outcome_of(r)
    if outcome is not None:
        tag, kind = outcome
        blame = r.blamed if r.verdict == Verdict.FAIL and r.blamed else " ".join(r.reqs)
        head = f"[{r.level or '-'}] {blame}: " if r.verdict == Verdict.FAIL else ""
        if r.verdict == Verdict.FAIL and not gating:
            head += "(does not gate) "
        el = ET.SubElement(case, tag, type=kind, message=_text(head + _first_line(r.message)))
        el.text = _text(r.message + (f"\n\nevidence: {evidence}" if evidence else ""))
    out, err = captured.get(r.nodeid, ("", ""))
    lines = [f"kvconform {r.verdict}: {r.nodeid}"] + ([f"evidence: {evidence}"] if evidence else [])
    ET.SubElement(case, "system-out").text = _text("\n".join(lines) + ("\n" + out if out else ""))
    if err:
        ET.SubElement(case, "system-err").text = _text(err)
    return tag if outcome is not None else None


def _suite_properties(facts: Mapping[str, Any]) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = []
    for key in ("target", "testbed", "seed", "strict", "pics_source", "report_dir"):
        if facts.get(key) is not None:
            pairs.append((f"kvconform.{key}", facts[key]))
    if facts.get("pics_overrides"):
        pairs.append(("kvconform.pics_set", "; ".join(facts["pics_overrides"])))
    if facts.get("command"):
        pairs.append(("kvconform.command", shlex.join(str(a) for a in facts["command"])))
    for name, value in sorted((facts.get("versions") or {}).items()):
        pairs.append((f"kvconform.version.{name}", value))
    return pairs


def _counts(el: ET.Element, tags: Sequence[str | None], seconds: float) -> None:
    el.set("tests", str(len(tags)))
    el.set("failures", str(tags.count("failure")))
    el.set("errors", str(tags.count("error")))
    if el.tag == "testsuite":
        el.set("skipped", str(tags.count("skipped")))
    el.set("time", _seconds(seconds))


def junit_document(results: Sequence[TestResult], facts: Mapping[str, Any], junit_dir: Path, *, strict: bool,
                   captured: Mapping[str, tuple[str, str]] | None = None,
                   collection_errors: Sequence[tuple[str, str]] = ()) -> ET.Element:
    """The ``<testsuites>`` element of a run (see the module docstring)."""
    captured = captured or {}
    root = ET.Element("testsuites", name="kvconform")
    by_suite: dict[str, list[TestResult]] = {}
    for r in results:
        by_suite.setdefault(r.suite or "-", []).append(r)
    timestamp, hostname = _timestamp(facts.get("started")), socket.gethostname()
    all_tags: list[str | None] = []
    total = 0.0
    for index, (suite, members) in enumerate(sorted(by_suite.items())):
        suite_el = ET.SubElement(root, "testsuite", name=suite, id=str(index), package=suite.split("-", 1)[0],
                                 timestamp=timestamp, hostname=hostname)
        _properties(suite_el, _suite_properties(facts))
        tags = [_testcase(suite_el, r, suite, junit_dir, strict, captured) for r in members]
        seconds = sum(r.duration for r in members)
        _counts(suite_el, tags, seconds)
        all_tags += tags
        total += seconds
    if collection_errors:
        suite_el = ET.SubElement(root, "testsuite", name=COLLECTION_SUITE, id=str(len(by_suite)),
                                 package="kvconform", timestamp=timestamp, hostname=hostname)
        tags = []
        for nodeid, text in collection_errors:
            case = ET.SubElement(suite_el, "testcase", name=_text(nodeid or "."), classname="collection", time="0.000")
            el = ET.SubElement(case, "error", type="kvconform.collection-error",
                               message=_text(_first_line(text) or "collection failed"))
            el.text = _text(text)
            tags.append("error")
        _counts(suite_el, tags, 0.0)
        all_tags += tags
    _counts(root, all_tags, total)
    return root


def write_junit(path: str | Path, results: Sequence[TestResult], facts: Mapping[str, Any], *, strict: bool,
                captured: Mapping[str, tuple[str, str]] | None = None,
                collection_errors: Sequence[tuple[str, str]] = ()) -> Path:
    """Write the JUnit file of a run to ``path`` (its folder is created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = junit_document(results, facts, path.parent, strict=strict, captured=captured,
                          collection_errors=collection_errors)
    ET.indent(root)
    tmp = path.with_name(path.name + ".tmp")
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(path)
    return path
