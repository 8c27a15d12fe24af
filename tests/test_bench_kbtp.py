"""Smoke test of bench/bench_kbtp.py: the smallest run completes and writes every figure (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_kbtp import main
from bench.bench_kbtp_wire import BINDINGS, SERVED, WINDOW_BINDINGS, WINDOWS
from bench.bench_kbtp_wire import main as wire_main

RDMA_MEASURES = {"fabric_write", "fabric_read", "alloc_store", "load", "free"}


def test_smallest_run_writes_positive_figures(tmp_path: Path) -> None:
    out = tmp_path / "kbtp.json"
    argv = ["--ops", "1", "--repeat", "1", "--seeds", "2", "--kbtp-seeds", "1", "--kbtp-rounds", "1",
            "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["block_size"] == 32 * 1024 and doc["argv"] == argv
    assert doc["memcpy_ops_per_second"] > 0
    assert set(doc["rdma"]) == {"chunk8", "chunk32768"}
    for chunk, row in doc["rdma"].items():
        assert set(row) == RDMA_MEASURES, chunk
        for name, m in row.items():
            for key in ("ops_per_second", "steps_per_op", "ratio_to_fabric_write", "ratio_to_fabric_read",
                        "ratio_to_memcpy"):
                assert m[key] > 0, f"{chunk} {name} {key} = {m[key]}"
        # a 32 KiB block moved by RDMA is at least one placement step per chunk
        assert row["fabric_write"]["steps_per_op"] >= 32 * 1024 // int(chunk[len("chunk"):])
    assert set(doc["explore"]) == {"fabric_tickets", "kbtp_deferred_free"}
    for name, ex, runs in (("fabric_tickets", doc["explore"]["fabric_tickets"], 2),
                           ("kbtp_deferred_free", doc["explore"]["kbtp_deferred_free"], 1)):
        assert ex["runs"] == runs and ex["failures"] == 0, (name, ex)
        assert ex["interleavings_per_second"] > 0 and ex["steps_per_run"] > 0, (name, ex)
        assert sum(ex["outcomes"].values()) == runs, (name, ex)


def test_wire_bench_smallest_run_writes_rates_and_window_openings(tmp_path: Path) -> None:
    """bench/bench_kbtp_wire.py: every fabric's figures and, per black-box race check and fabric, the openings
    of its window counted from the attempts the check records (no timing asserted)."""
    out = tmp_path / "wire.json"
    argv = ["--ops", "2", "--repeat", "1", "--blocks", "4096", "--windows", "1", "--window-budget", "10",
            "--json", str(out)]
    assert wire_main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert set(doc["blocks"]["4096"]) == set(BINDINGS)
    for binding, row in doc["blocks"]["4096"].items():
        assert set(row) == {"alloc_store", "load", "free"}, binding
        assert all(m["ops_per_second"] > 0 for m in row.values()), binding
    assert set(doc["windows"]) == set(WINDOWS)
    for window, row in doc["windows"].items():
        assert set(row) == set(WINDOW_BINDINGS), window
        for fabric, w in row.items():
            assert w["outcome"] == "pass" and w["opened"] >= 1 and w["openings_per_second"] > 0, (window, fabric, w)
            assert w["attempts"] >= w["opened"], (window, fabric, w)


def test_wire_bench_served_target_rows(tmp_path: Path) -> None:
    """bench/bench_kbtp_wire.py --served: the target in a process of its own (`kvconform serve kbtp-target`)
    gives the same rows, with both processes' CPU per operation (no timing asserted)."""
    out = tmp_path / "served.json"
    argv = ["--ops", "2", "--repeat", "1", "--blocks", "4096", "--windows", "0", "--served", "--json", str(out)]
    assert wire_main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["failures"] == []
    assert set(doc["blocks"]["4096"]) == set(BINDINGS) | set(SERVED)
    for binding in SERVED:
        row = doc["blocks"]["4096"][binding]
        assert set(row) == {"alloc_store", "load", "free"}, binding
        assert all(m["ops_per_second"] > 0 and m["cpu_us_per_op"] > 0 for m in row.values()), (binding, row)
        # (/proc counts in clock ticks: six operations may not reach one)
        assert all(m["served_target_cpu_us_per_op"] >= 0 for m in row.values()), (binding, row)
