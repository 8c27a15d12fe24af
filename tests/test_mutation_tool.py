"""tools/mutation.py's parsing and summary logic (no mutation run: that is `tox -e mutation`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools import mutation
from tools.mutation import Summary, outcome_of, parse_dump, render, summarise, triage_key

DIFF = ("--- mutation diff ---\n+++ akvconform/kbtp/ring.py\n--- bkvconform/kbtp/ring.py\n@@ -70,1 +70,1 @@\n"
        "-        return handle - self.base_handle\n+        return handle ^ self.base_handle\n")


def _line(occurrence: int, result: dict[str, Any] | None, line: int = 70) -> str:
    item = {"job_id": f"j{occurrence}", "mutations": [{
        "module_path": "kvconform/kbtp/ring.py", "operator_name": "core/ReplaceBinaryOperator_Sub_BitXor",
        "occurrence": occurrence, "start_pos": [line, 15], "end_pos": [line, 16], "operator_args": {},
        "definition_name": "index"}]}
    return json.dumps([item, result])


def _result(worker: str, test: str | None, output: str = "", diff: str = DIFF) -> dict[str, Any]:
    return {"worker_outcome": worker, "output": output, "test_outcome": test, "diff": diff}


@pytest.mark.parametrize(("result", "word"), [
    (None, "not-run"),
    (_result("skipped", None), "not-sampled"),
    (_result("no-test", None), "no-test"),
    (_result("exception", "incompetent"), "incompetent"),
    (_result("abnormal", None), "incompetent"),
    (_result("normal", "killed", "1 failed"), "killed"),
    (_result("normal", "killed", "timeout"), "timeout"),
    (_result("normal", "survived", "73 passed"), "survived"),
    (_result("normal", "incompetent"), "incompetent"),
])
def test_outcome_of_each_cosmic_ray_result(result: dict[str, Any] | None, word: str) -> None:
    assert outcome_of(result) == word


def test_summary_counts_every_outcome_and_lists_only_survivors() -> None:
    lines = [_line(0, _result("normal", "killed", "x")), _line(1, _result("normal", "killed", "timeout")),
             _line(2, _result("normal", "survived", "ok")), _line(3, _result("skipped", None)),
             _line(4, None), _line(5, _result("no-test", None)), _line(6, _result("exception", "incompetent")),
             "", _line(7, _result("normal", "survived", "ok"), line=12)]
    s = summarise("kvconform/kbtp/ring.py", parse_dump(lines))
    assert (s.generated, s.run, s.killed, s.timeout, s.survived, s.incompetent, s.not_sampled, s.not_run) == (
        7, 5, 1, 1, 2, 1, 1, 1)
    assert s.score == pytest.approx(2 / 4)
    assert [sv["line"] for sv in s.survivors] == [12, 70]  # sorted by line
    assert s.survivors[1]["change"] == "return handle - self.base_handle -> return handle ^ self.base_handle"
    assert Summary.from_json(s.to_json()) == s


def test_score_is_none_when_nothing_ran() -> None:
    assert summarise("m.py", parse_dump([_line(0, _result("skipped", None))])).score is None


def test_render_joins_results_and_triage(tmp_path: Path) -> None:
    s = summarise("kvconform/kbtp/ring.py", parse_dump([_line(0, _result("normal", "killed", "x")),
                                                        _line(1, _result("normal", "survived", "ok")),
                                                        _line(2, _result("normal", "survived", "ok"), line=9)]))
    runs = {s.module: {"summary": s.to_json(), "command": "python -m pytest conformance/kbtp", "finished": "9 s",
                       "how": "all 3"}}
    key = triage_key(s.module, s.survivors[1])
    assert key == ("kvconform/kbtp/ring.py:70:return handle - self.base_handle -> "
                   "return handle ^ self.base_handle")
    doc = render(runs, {key: "equivalent: base_handle is aligned"})
    assert "| `kvconform/kbtp/ring.py` | 3 | 3 | 1 | 0 | 2 | 1 | 0 | 0 | 0 | 33 % | 50 % |" in doc
    assert "| all | 3 | 3 | 1 | 0 | 2 | 1 | 0 | 0 | 0 | 33 % | 50 % |" in doc
    assert "equivalent: base_handle is aligned" in doc
    assert "1 survivor(s) untriaged." in doc
    assert "## Gaps handed to the suites" not in doc
    gap = render(runs, {key: "gap handed to kbtp-target: an unaligned Base Handle"})
    assert "## Gaps handed to the suites" in gap and "an unaligned Base Handle" in gap.split("## Gaps")[1]
    assert "`python -m pytest conformance/kbtp`" in doc
    triage = tmp_path / "triage.yaml"
    triage.write_text(f"{json.dumps(key)}: 'killed by new check test_x'\n")
    assert mutation.load_triage(triage) == {key: "killed by new check test_x"}


def test_the_work_folder_must_be_outside_the_checkout() -> None:
    with pytest.raises(SystemExit):
        mutation.main(["run", "kbtp", "--work", str(mutation.ROOT / "mutants")])


def test_every_core_module_exists_and_its_suites_are_folders() -> None:
    for core in mutation.CORES.values():
        for module in core.modules:
            assert (mutation.ROOT / module).is_file(), module
        for suite in core.suites:
            assert (mutation.ROOT / suite).is_dir(), suite
