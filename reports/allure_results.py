"""What a kvconform run adds to allure-pytest's results folder (``--alluredir``).

allure-pytest writes one ``<uuid>-result.json`` per test from pytest's outcome, which is not the check's
verdict: an inconclusive check is a pytest skip, a harness error an exception like any other. On the worker
the plugin labels each check's result with its nodeid (NODEID_LABEL) and links it to its requirements; at the
end of the session the controller, which holds every verdict, gives each labelled result its verdict
(``apply_verdicts``: fail -> failed, inconclusive -> **broken**, never skipped, not-applicable and xfail ->
skipped) with a message that starts with the verdict and the blamed requirement's level, and writes:

- ``environment.properties``: target, testbed, seed, strict, PICS source, suites, command, versions;
- ``executor.json``: kvconform and its version, the command, the report directory;
- ``categories.json``: failures by the blamed requirement's level (MUST/MUST NOT/RULE; SHOULD/SHOULD NOT; MAY),
  inconclusive, and harness errors, matched on the message prefixes written by ``status_message``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvconform.catalog import Catalog
from kvconform.policy import is_harness_error
from kvconform.results import TestResult
from kvconform.verdicts import Verdict, gates

__all__ = ["CATEGORIES", "NODEID_LABEL", "allure_status", "apply_verdicts", "properties_text", "requirement_link",
           "status_message", "write_allure"]

NODEID_LABEL = "kvconform_nodeid"

_STATUS: dict[str, str] = {Verdict.PASS: "passed", Verdict.FAIL: "failed", Verdict.INCONCLUSIVE: "broken",
           Verdict.NOT_APPLICABLE: "skipped", Verdict.XFAIL: "skipped"}
HARNESS_ERROR = "harness error"

# Allure matches messageRegex against the whole message (Java's String.matches); (?s) lets . cross lines.
CATEGORIES: list[dict[str, Any]] = [
    {"name": "Failed MUST, MUST NOT and RULE requirements (always gate)", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s)fail \[(MUST|MUST NOT|RULE)\] .*"},
    {"name": "Failed SHOULD and SHOULD NOT requirements (gate with --strict)", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s)fail \[(SHOULD|SHOULD NOT)\] .*"},
    {"name": "Failed MAY requirements (never gate)", "matchedStatuses": ["failed"],
     "messageRegex": r"(?s)fail \[MAY\] .*"},
    {"name": "Inconclusive: the harness could not observe the outcome or reach the target",
     "matchedStatuses": ["broken"], "messageRegex": r"(?s)inconclusive: .*"},
    {"name": "Harness errors (a bug in kvconform, not a verdict on the target)", "matchedStatuses": ["broken"],
     "messageRegex": rf"(?s){HARNESS_ERROR}: .*"},
]


def allure_status(verdict: str) -> str:
    """The Allure status of a verdict (an unknown verdict is broken: never shown as passed)."""
    return _STATUS.get(verdict, "broken")


def status_message(r: TestResult, strict: bool) -> str:
    """The message categories.json matches: ``fail [LEVEL] ID: ...``, ``inconclusive: ...``, ``harness error: ...``."""
    if r.verdict == Verdict.FAIL:
        blamed = r.blamed or " ".join(r.reqs)
        gate = "" if gates(r.level, strict=strict) else " (does not gate)"
        return f"fail [{r.level or '-'}] {blamed}{gate}: {r.message}"
    if r.verdict == Verdict.INCONCLUSIVE and is_harness_error(r.verdict, r.message):
        return f"{HARNESS_ERROR}: {r.message}"
    return f"{r.verdict}: {r.message}" if r.message else str(r.verdict)


def requirement_link(catalog: Catalog, rid: str, patterns: Iterable[Sequence[str]]) -> tuple[str, str]:
    """(url, name) of the "tms" link from a check to requirement ``rid``: the bare id when the user gave
    ``--allure-link-pattern tms:<url with {}>`` (allure-pytest formats it), else the catalog file's URI."""
    name = f"{rid} [{catalog.get(rid).level}]" if rid in catalog else rid
    if any(len(p) == 2 and p[0] == "tms" for p in patterns):
        return rid, name
    proto = rid.split("-", 1)[0].lower()
    return Path(catalog.file_for(proto)).resolve().as_uri() + "#" + rid, name


def _escape(text: str, key: bool) -> str:
    """java.util.Properties escaping (Allure reads the file with Properties.load, ISO-8859-1)."""
    out = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif (key and ch in "=:#! ") or (ch == " " and i == 0):
            out.append("\\" + ch)
        elif ord(ch) > 0x7E or ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else
                       "".join(f"\\u{u:04x}" for u in _utf16(ch)))
        else:
            out.append(ch)
    return "".join(out)


def _utf16(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def properties_text(pairs: Iterable[tuple[str, object]]) -> str:
    """``key=value`` lines in java.util.Properties syntax."""
    return "".join(f"{_escape(k, True)}={_escape(str(v), False)}\n" for k, v in pairs)


def _environment(results: Sequence[TestResult], facts: Mapping[str, Any]) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = []
    for key in ("target", "testbed", "seed", "strict", "pics_source", "report_dir"):
        if facts.get(key) is not None:
            pairs.append((key.replace("_", "."), facts[key]))
    if facts.get("pics_overrides"):
        pairs.append(("pics.set", "; ".join(facts["pics_overrides"])))
    pairs.append(("suites", " ".join(sorted({r.suite for r in results if r.suite}))))
    if facts.get("command"):
        pairs.append(("command", shlex.join(str(a) for a in facts["command"])))
    pairs += [(f"version.{k}", v) for k, v in sorted((facts.get("versions") or {}).items())]
    return pairs


def _executor(facts: Mapping[str, Any]) -> dict[str, Any]:
    version = (facts.get("versions") or {}).get("kvconform", "unknown")
    doc: dict[str, Any] = {"name": f"kvconform {version}", "type": "kvconform",
                           "buildName": shlex.join(str(a) for a in facts.get("command") or ["kvconform"]),
                           "reportName": "kvconform conformance results"}
    if facts.get("report_dir"):
        doc["reportUrl"] = Path(str(facts["report_dir"])).resolve().as_uri()
    return doc


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False), "utf-8")
    os.replace(tmp, path)


def apply_verdicts(alluredir: Path, results: Sequence[TestResult], strict: bool) -> int:
    """Give every result file that NODEID_LABEL ties to a check its verdict; returns how many were changed."""
    by_nodeid = {r.nodeid: r for r in results}
    changed = 0
    for path in sorted(alluredir.glob("*-result.json")):
        try:
            doc = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue  # not ours to judge: allure itself reports a file it cannot read
        nodeid = next((lab.get("value") for lab in doc.get("labels", []) if lab.get("name") == NODEID_LABEL), None)
        r = by_nodeid.get(str(nodeid)) if nodeid is not None else None
        if r is None:
            continue
        details = dict(doc.get("statusDetails") or {})
        details["message"] = status_message(r, strict)
        doc["status"], doc["statusDetails"] = allure_status(r.verdict), details
        _write_json(path, doc)
        changed += 1
    return changed


def write_allure(alluredir: Path, results: Sequence[TestResult], facts: Mapping[str, Any], *, strict: bool) -> None:
    """Verdicts into allure-pytest's result files, and the environment, executor and categories files."""
    alluredir.mkdir(parents=True, exist_ok=True)
    apply_verdicts(alluredir, results, strict)
    (alluredir / "environment.properties").write_text(properties_text(_environment(results, facts)), "latin-1")
    _write_json(alluredir / "executor.json", _executor(facts))
    _write_json(alluredir / "categories.json", CATEGORIES)


def category_of(message: str, status: str) -> str | None:
    """The first category of CATEGORIES a result falls in, matched as Allure does (whole message)."""
    for category in CATEGORIES:
        if status in category["matchedStatuses"] and re.fullmatch(category["messageRegex"], message):
            return str(category["name"])
    return None
