"""Smoke test of bench/bench_startup.py: one suite, one pair; every figure and the breakdown are written (no
timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_startup import BASELINE_IMPORTS, main, parse_importtime


def test_one_suite_one_pair_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "startup.json"
    code = main(["--quick", "--runs", "1", "--suites", "kbtp-initiator", "--importtime-runs", "1",
                 "--json", str(out)])
    doc = json.loads(out.read_text())
    assert code == 0 and doc["failures"] == [] and doc["baseline"] == BASELINE_IMPORTS
    (suite,) = doc["suites"]
    assert suite["suite"] == "kbtp-initiator" and suite["collected"] > 0
    assert len(suite["run_s"]) == len(suite["baseline_s"]) == len(suite["ratios"]) == 1
    assert suite["ratio"] > 0 and suite["cpu_ratio"] > 0 and doc["worst_ratio"] == suite["ratio"]
    left = doc["breakdown"]
    assert left["suite"] == "kbtp-initiator" and 0 < left["beyond_baseline_import_s"] <= left["import_s"]
    assert any(name.startswith("kvconform.") for name in left["modules"]), sorted(left["modules"])[:20]


def test_importtime_lines_are_read() -> None:
    text = ("import time: self [us] | cumulative | imported package\n"
            "import time:       120 |        120 |   kvconform.argtypes\n"
            "import time:       300 |        420 | kvconform.cli\n"
            "something else\n")
    assert parse_importtime(text) == {"kvconform.argtypes": 120, "kvconform.cli": 300}
