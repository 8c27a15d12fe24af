"""A run as the store keeps it, read from the report folder the run wrote (coverage.json: its Identity block and
its checks), so recording needs nothing the run did not already produce.

The *identity key* says which runs are the same experiment: the implementation (name, version, vendor, build,
image digest, target), the harness version, the catalogs' and testbed's SHA-256, the PICS values, the binding, the
draft and the suites. The seed is not in it (random by default: a verdict that changes with the seed is flaky for
whoever gates on it), nor the harness commit (a pinned release has one version and no commit).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvconform.results import TestResult

__all__ = ["MOQT_DRAFT", "CheckRecord", "ReportError", "RunRecord", "read_report_dir"]

COVERAGE = "coverage.json"
MOQT_DRAFT = "22"  # the draft kvconform's MOQT stack speaks (kvconform/moqt/quic.py ALPN moqt-22)
_WIRE_OPTION = "--kvconform-kbtp-wire"


class ReportError(ValueError):
    """A report folder the store cannot read; the message names the file and the field."""


@dataclass(frozen=True)
class CheckRecord:
    """One check of a run: its verdict, message and evidence path (relative to the report folder)."""

    nodeid: str
    suite: str | None
    reqs: tuple[str, ...]
    level: str | None
    verdict: str
    message: str
    evidence: str | None
    blamed: str | None
    duration: float
    reached: tuple[str, ...] | None = None  # the requirements an assertion evaluated (None: not recorded)

    def result(self) -> TestResult:
        """As the report writers know a check (the blame rule: TestResult.verdict_for)."""
        return TestResult(nodeid=self.nodeid, suite=self.suite, reqs=self.reqs, level=self.level,
                          verdict=self.verdict, message=self.message, duration=self.duration,
                          evidence=self.evidence, blamed=self.blamed, reached=self.reached)


@dataclass(frozen=True)
class RunRecord:
    """One run: what was tested, with which inputs, and every check's outcome."""

    report_dir: str
    coverage_sha256: str
    implementation: str
    implementation_version: str | None
    implementation_vendor: str | None
    implementation_build: str | None
    image_digest: str | None
    target_name: str
    target_kind: str
    target_value: str
    harness_version: str
    harness_commit: str
    testbed_name: str | None
    testbed_sha256: str | None
    catalogs: dict[str, str | None]  # catalog file name -> SHA-256
    pics: dict[str, Any]  # dotted path -> value
    seed: int
    binding: str | None
    draft: str | None
    suites: tuple[str, ...]
    strict: bool
    exit_code: int | None
    started: str
    finished: str
    checks: tuple[CheckRecord, ...] = ()
    matrix_dir: str | None = None
    run_id: int | None = None  # set once stored
    recorded: str | None = None

    @property
    def identity_key(self) -> str:
        """SHA-256 of what makes two runs the same experiment (module docstring)."""
        same = {"implementation": [self.implementation, self.implementation_version, self.implementation_vendor,
                                   self.implementation_build, self.image_digest, self.target_kind,
                                   self.target_value],
                "harness": self.harness_version, "testbed": self.testbed_sha256, "catalogs": self.catalogs,
                "pics": self.pics, "binding": self.binding, "draft": self.draft, "suites": list(self.suites)}
        return hashlib.sha256(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()

    def verdicts(self) -> dict[str, str]:
        """Check id (nodeid) -> verdict."""
        return {c.nodeid: c.verdict for c in self.checks}


def _get(doc: Mapping[str, Any], path: str, where: Path) -> Any:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ReportError(f"{where}: field {path!r} is missing (not a kvconform coverage.json?)")
        node = node[part]
    return node


def _image_digest(target: Mapping[str, Any]) -> str | None:
    # a container image pinned by digest (docker:IMAGE@sha256:..., or a testbed entry's docker: IMAGE@sha256:...)
    params = target.get("params") or {}
    for ref in (str(target.get("value", "")), str(params.get("docker", "") if isinstance(params, Mapping) else "")):
        if "@sha256:" in ref:
            return "sha256:" + ref.rpartition("@sha256:")[2]
    return None


def _binding(suites: list[str], pics: Mapping[str, Any], target: Mapping[str, Any],
             command_line: list[str]) -> str | None:
    """KBTP runs: the declared RDMA binding (kbtp.<role>.binding) over the wire the harness used."""
    if not any(s.startswith("kbtp-") for s in suites):
        return None
    declared = sorted({str(v) for k, v in pics.items() if k.startswith("kbtp.") and k.endswith(".binding")})
    value = str(target.get("value", ""))
    if value.startswith("kbtp+"):
        wire = value[len("kbtp+"):].partition("://")[0]
    elif _WIRE_OPTION in command_line[:-1]:
        wire = command_line[command_line.index(_WIRE_OPTION) + 1]
    else:
        wire = "emulated"
    return f"{','.join(declared) or 'undeclared'} over {wire}"


def _draft(suites: list[str], pics: Mapping[str, Any]) -> str | None:
    """KVCS and MOQT runs: the MOQT drafts the implementation declares, else the one the harness speaks."""
    if not any(s.split("-", 1)[0] in ("kvcs", "moqt") for s in suites):
        return None
    declared = sorted({str(d) for k, v in pics.items() if k.endswith(".drafts") and isinstance(v, list) for d in v})
    return ",".join(declared) if declared else MOQT_DRAFT


def _check(test: Mapping[str, Any]) -> CheckRecord:
    result = TestResult.from_dict(test)
    return CheckRecord(nodeid=result.nodeid, suite=result.suite, reqs=result.reqs, level=result.level,
                       verdict=result.verdict, message=result.message, evidence=result.evidence,
                       blamed=result.blamed, duration=float(result.duration), reached=result.reached)


def read_report_dir(report_dir: str | os.PathLike[str], matrix_dir: str | None = None) -> RunRecord:
    """The run a report folder holds (its coverage.json, schema reports/schema/report.schema.json)."""
    root = Path(report_dir)
    path = root / COVERAGE
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read the run's report: {exc.strerror or exc} (is {root} a kvconform "
                          "--report-dir?)") from None
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON: {exc}") from None
    identity = _get(doc, "identity", path)
    impl = _get(identity, "implementation", path)
    target = _get(doc, "meta.target", path)
    pics = {str(v["path"]): v["value"] for v in _get(identity, "pics.values", path)}
    run = _get(identity, "run", path)
    suites = sorted(str(s) for s in run.get("suites", []))
    command_line = [str(a) for a in doc["meta"].get("command_line", [])]
    catalogs = {str(s["catalog"]["name"]): s["catalog"].get("sha256") for s in identity.get("specs", [])}
    return RunRecord(
        report_dir=str(root.resolve()),
        coverage_sha256=hashlib.sha256(raw).hexdigest(),
        implementation=str(impl.get("name") or _get(identity, "target.name", path)),
        implementation_version=impl.get("version"),
        implementation_vendor=impl.get("vendor"),
        implementation_build=impl.get("build") or impl.get("firmware"),
        image_digest=_image_digest(target),
        target_name=str(_get(identity, "target.name", path)),
        target_kind=str(_get(identity, "target.kind", path)),
        target_value=str(_get(identity, "target.value", path)),
        harness_version=str(_get(identity, "harness.version", path)),
        harness_commit=str(_get(identity, "harness.commit", path)),
        testbed_name=identity.get("testbed", {}).get("name"),
        testbed_sha256=identity.get("testbed", {}).get("sha256"),
        catalogs=catalogs,
        pics=pics,
        seed=int(_get(run, "seed", path)),
        binding=_binding(suites, pics, target, command_line),
        draft=_draft(suites, pics),
        suites=tuple(suites),
        strict=bool(run.get("strict", False)),
        exit_code=run.get("exit_code"),
        started=str(_get(run, "started", path)),
        finished=str(_get(run, "finished", path)),
        checks=tuple(sorted((_check(t) for t in _get(doc, "tests", path)), key=lambda c: c.nodeid)),
        matrix_dir=matrix_dir,
    )
