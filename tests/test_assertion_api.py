"""The assertion API and the blame rule (kvconform.verdicts, docs/conventions.md "Verdict policy").

Statically, over every conformance module: no bare ``assert`` (it would blame no requirement, or the wrong
one), and every requirement id written inline in a check (``req="..."``) is one its ``@pytest.mark.req``
cites. At run time the CheckContext enforces the same for ids computed at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvconform.catalog import load_catalogs
from kvconform.reports.coverage import build_coverage
from kvconform.results import TestResult
from kvconform.verdicts import (
    CheckContext,
    Findings,
    HarnessBug,
    Violation,
    activate_check,
    check,
    check_equal,
    check_no_problems,
    check_one_of,
    violation,
)

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "conformance"


def _modules() -> list[Path]:
    return sorted(p for p in CONFORMANCE.rglob("*.py") if "__pycache__" not in p.parts)


def _marker_ids(func: ast.FunctionDef) -> set[str] | None:
    """The literal ids of a check's @pytest.mark.req and @pytest.mark.blames decorators (None when any is
    computed)."""
    ids: set[str] = set()
    for dec in func.decorator_list:
        if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and dec.func.attr in ("req", "blames"):
            for arg in dec.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    ids.add(arg.value)
                else:
                    return None
    return ids


def _inline_ids(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            for kw in sub.keywords:
                if kw.arg == "req" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    out.add(kw.value.value)
    return out


def test_conformance_code_has_no_bare_assert() -> None:
    found = [f"{p.relative_to(ROOT)}:{n.lineno}" for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Assert)]
    assert not found, ("bare assert in conformance code (use kvconform.verdicts.check... so a failure blames the "
                       f"requirement it names): {found}")


def test_inline_requirement_ids_are_cited_by_the_check() -> None:
    catalog = load_catalogs()
    problems: list[str] = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for rid in _inline_ids(tree):
            if rid not in catalog:
                problems.append(f"{path.relative_to(ROOT)}: {rid} is not in any catalog")
        for func in tree.body:
            if not (isinstance(func, ast.FunctionDef) and func.name.startswith("test_")):
                continue
            cited = _marker_ids(func)
            if cited is None or not cited:
                continue
            stray = _inline_ids(func) - cited
            if stray:
                problems.append(f"{path.relative_to(ROOT)}::{func.name} asserts {sorted(stray)}, not among the ids "
                                f"its @pytest.mark.req cites {sorted(cited)}")
    assert not problems, "\n".join(sorted(set(problems)))


# ---- the API itself -----------------------------------------------------------------------------------------


def test_a_failed_assertion_names_field_seen_expected_and_requirement() -> None:
    with pytest.raises(Violation) as info:
        check_equal("Status at offset 22", 3, 0, req="DEMO-A")
    assert info.value.requirement == "DEMO-A"
    assert str(info.value) == "DEMO-A: Status at offset 22: seen 3, expected 0"
    with pytest.raises(Violation, match=r"^DEMO-B: crc32c: seen 4294967295 \(0xffffffff\), expected 1$"):
        check(False, "crc32c", req="DEMO-B", seen=0xFFFFFFFF, expected=1)
    with pytest.raises(Violation, match=r"DEMO-C: reaction: seen 'OK', expected one of 'GOAWAY', 'RST'"):
        check_one_of("OK", {"RST", "GOAWAY"}, what="reaction", req="DEMO-C")
    with pytest.raises(Violation, match=r"(?s)DEMO-D: stream: 2 problem\(s\)\n  - a\n  - b"):
        check_no_problems(["a", "b"], what="stream", req="DEMO-D")
    with pytest.raises(Violation, match="DEMO-E: never answered"):
        violation("never answered", req="DEMO-E")
    check(True, "holds", req="DEMO-A")
    check_one_of(1, [1, 2], what="x", req="DEMO-A")
    check_no_problems([], what="x", req="DEMO-A")


def test_findings_blame_the_first_problem_and_list_all() -> None:
    findings = Findings("publication")
    findings.expect(True, "DEMO-A", "fine")
    findings.expect(False, "DEMO-B", "first wrong thing")
    findings.add("DEMO-C", "second wrong thing")
    with pytest.raises(Violation) as info:
        findings.judge()
    assert info.value.requirement == "DEMO-B"
    assert "[DEMO-B] first wrong thing" in str(info.value) and "[DEMO-C] second wrong thing" in str(info.value)


def test_the_running_check_records_reached_ids_and_refuses_uncited_ones() -> None:
    context = CheckContext("conformance/x/y/test_z.py::test_q", frozenset({"DEMO-A", "DEMO-B"}))
    previous = activate_check(context)
    try:
        check(True, "a", req="DEMO-A")
        with pytest.raises(Violation):
            check(False, "b", req="DEMO-B")
        assert context.reached == {"DEMO-A", "DEMO-B"}
        with pytest.raises(HarnessBug, match=r"asserts DEMO-Z, which its @pytest\.mark\.req does not cite"):
            check(True, "z", req="DEMO-Z")
    finally:
        activate_check(previous)


def test_a_blame_only_id_may_fail_the_check_but_is_never_reached() -> None:
    """``@pytest.mark.blames``: a diagnosis may name the id when the state points there; an assertion of it that
    holds claims no pass (it is not reached), one that fails blames it."""
    context = CheckContext("conformance/x/y/test_z.py::test_q", frozenset({"DEMO-A"}), may_blame=frozenset({"DEMO-R"}))
    previous = activate_check(context)
    try:
        check(True, "the ring rule held", req="DEMO-R")
        assert context.reached == set()
        with pytest.raises(Violation) as info:
            check(False, "the ring rule broken", req="DEMO-R")
        assert info.value.requirement == "DEMO-R" and context.reached == set()
        assert context.allows("DEMO-R") and context.allows("DEMO-A") and not context.allows("DEMO-Z")
        with pytest.raises(HarnessBug, match=r"it may blame DEMO-R"):
            check(True, "z", req="DEMO-Z")
    finally:
        activate_check(previous)


def test_a_blamed_blame_only_id_is_failed_in_coverage_and_a_pass_does_not_list_it() -> None:
    catalog = load_catalogs()
    failed = TestResult("conformance/kbtp/target/test_x.py::test_f", "kbtp-target", ("KBTP-QUOTA-ALLOC-BOUNDED",),
                        "RULE", "fail", blamed="KBTP-FREE-SLOT-ORDER", reached=())
    passed = TestResult("conformance/kbtp/target/test_x.py::test_p", "kbtp-target", ("KBTP-QUOTA-ALLOC-BOUNDED",),
                        "RULE", "pass", reached=("KBTP-QUOTA-ALLOC-BOUNDED",))
    for results, expected in (([failed], "fail"), ([passed], None)):
        doc = build_coverage(catalog, results, {})
        entries = {r["id"]: r for r in doc["protocols"]["kbtp"]["roles"]["target"]["requirements"]}
        tests = entries["KBTP-FREE-SLOT-ORDER"]["tests"]
        assert (tests[0]["verdict"] if tests else None) == expected, entries["KBTP-FREE-SLOT-ORDER"]
