"""The report writers in a kvconform session (registered by kvconform.reports.plugin): each check's evidence page
beside its JSON, its Allure labels, and at the session's end the coverage report with its certification, the
HTML page, the JUnit and Allure results, the console summary and, last, the report folder's SHA-256 manifest."""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import allure
import pytest

from kvconform.fixtures.plugin import suite_of
from kvconform.fixtures.session import Context, context_of, req_ids
from kvconform.fixtures.state import KvconformState, now, state_of, versions
from kvconform.reports.allure_results import NODEID_LABEL, requirement_link, write_allure
from kvconform.reports.certification import certify
from kvconform.reports.console import failure_blocks
from kvconform.reports.coverage import build_coverage, provisional_counts, suite_counts, write_coverage_json
from kvconform.reports.evidence_html import write_evidence_html
from kvconform.reports.html import write_html
from kvconform.reports.identity import build_identity
from kvconform.reports.junit import write_junit
from kvconform.reports.manifest import write_manifest
from kvconform.verdicts import strongest_level

_ALLURE_SEVERITY = {"MUST": "critical", "MUST NOT": "critical", "RULE": "critical", "SHOULD": "normal",
                    "SHOULD NOT": "normal", "MAY": "minor"}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """In Allure, a check is filed under its protocol (epic), suite (feature) and requirements (stories)."""
    ids = req_ids(item)
    if not ids or not item.config.getoption("allure_report_dir", None):
        return
    catalog = context_of(item.config).catalog()
    suite = suite_of(item) or ""
    allure.dynamic.epic(suite.split("-", 1)[0])
    allure.dynamic.feature(suite)
    # The controller finds this result again by it, to give it the check's verdict (allure_results.py).
    allure.dynamic.label(NODEID_LABEL, item.nodeid)
    patterns = item.config.getoption("allure_link_pattern", None) or []
    for rid in ids:
        allure.dynamic.story(rid)
        url, name = requirement_link(catalog, rid, patterns)
        allure.dynamic.link(url, link_type="tms", name=name)
    level = strongest_level([catalog.get(i).level for i in ids if i in catalog])
    if level:
        allure.dynamic.tag(level)
        allure.dynamic.severity(_ALLURE_SEVERITY.get(level, "normal"))


@pytest.hookimpl(optionalhook=True)
def pytest_kvconform_evidence_written(config: pytest.Config, path: Path, bundle: dict[str, Any]) -> None:
    """A readable page beside each check's evidence JSON."""
    report_dir = state_of(config).report_dir
    assert report_dir is not None  # evidence is written only with a report folder
    write_evidence_html(path, bundle, report_dir)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
    # After the controller decided the exit status (fixtures/controller.py): the reports record it.
    yield
    state = state_of(session.config)
    if state.is_worker:
        return
    context = context_of(session.config)
    if state.report_dir is not None and state.results:
        _write_reports(session, state, context)
    if session.config.getoption("kvconform_junit"):
        path = Path(session.config.getoption("kvconform_junit"))
        write_junit(path, state.results, _run_facts(session, state, context), strict=state.strict,
                    captured=state.captured, collection_errors=state.collection_errors)
    if state.results and session.config.getoption("allure_report_dir", None):
        write_allure(Path(session.config.getoption("allure_report_dir")), state.results,
                     _run_facts(session, state, context), strict=state.strict)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # Last of all (after JUnit and Allure wrote theirs): the SHA-256 manifest of the whole report folder.
    state = state_of(config)
    if not state.is_worker and state.report_dir is not None and (state.report_dir / "coverage.json").is_file():
        write_manifest(state.report_dir)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = state_of(config)
    if not state.results:
        return
    tr = terminalreporter
    tr.section("kvconform")
    for suite, counts in suite_counts(state.results).items():
        tr.write_line(f"{suite}: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    for line in failure_blocks(state.results, state.strict, state.report_dir):
        tr.write_line(line)
    provisional = provisional_counts(context_of(config).catalog(), state.results)
    if provisional:
        tr.write_line("checks resting on a provisional profile: "
                      + ", ".join(f"{n} on {name}" for name, n in provisional.items()))
    tr.write_line(f"seed {state.seed}; strict {state.strict}")
    if state.report_dir is not None:
        for name in ("coverage.json", "coverage.html", "evidence"):
            tr.write_line(f"report: {state.report_dir / name}")


def _run_facts(session: pytest.Session, state: KvconformState, context: Context) -> dict[str, Any]:
    """What the JUnit and Allure files say of the run (the certification report has its own identity block)."""
    target = context.target() if state.results else None
    named = target is not None and target.name != target.value
    return {
        "target": f"{target.name} ({target.kind} {target.value})" if target is not None and named
        else session.config.getoption("kvconform_target"),
        "pics_overrides": list(target.overrides) if target is not None else [],
        "testbed": context.testbed().path if state.results else session.config.getoption("kvconform_testbed"),
        "seed": state.seed,
        "strict": state.strict,
        "pics_source": target.source if target is not None else None,
        "started": state.started,
        "finished": now(),
        "command": list(sys.argv),
        "report_dir": str(state.report_dir) if state.report_dir is not None else None,
        "versions": versions(),
    }


def _write_reports(session: pytest.Session, state: KvconformState, context: Context) -> None:
    config = session.config
    target = context.target()
    finished, stack = now(), versions()
    meta = {
        "started": state.started,
        "finished": finished,
        "seed": state.seed,
        "target": target.describe(),
        "testbed": context.testbed().path,
        "pics": target.pics,
        "pics_source": target.source,
        "pics_defaulted": target.defaulted,
        "strict": state.strict,
        "exit_code": int(session.exitstatus),
        "versions": stack,
        "command_line": [sys.argv[0], *config.invocation_params.args],
        "report_dir": str(state.report_dir),
    }
    assert state.report_dir is not None
    for more in config.hook.pytest_kvconform_report_meta(config=config, report_dir=state.report_dir):
        meta.update(more)  # e.g. the deterministic transport's transcript, beside the seed that replays it
    doc = build_coverage(context.catalog(), state.results, meta,
                         all_protocols=bool(config.getoption("kvconform_all_protocols")),
                         report_dir=str(state.report_dir))
    identity = build_identity(
        target=target, testbed=context.testbed(), catalog=context.catalog(), protocols=doc["protocols"],
        suites={r.suite for r in state.results if r.suite}, command=config.getoption("kvconform_command"),
        argv=list(config.invocation_params.args), cwd=str(config.invocation_params.dir), seed=state.seed,
        strict=state.strict, sweep=str(config.getoption("kvconform_sweep")), started=state.started,
        finished=finished, exit_code=int(session.exitstatus),
        versions=stack)
    doc = certify(doc, identity, strict=state.strict, exit_code=int(session.exitstatus),
                  report_dir=str(state.report_dir))
    write_coverage_json(state.report_dir / "coverage.json", doc)
    write_html(doc, state.report_dir / "coverage.html", state.report_dir)


