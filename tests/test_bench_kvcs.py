"""Smoke test of bench/bench_kvcs.py: the quick cache crosses our relay intact and every figure is written
(no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_kvcs import QUICK, main


@pytest.mark.timeout(180)
@pytest.mark.parametrize("variant", ["live", "completed"])
def test_quick_cache_crosses_our_relay_intact(tmp_path: Path, variant: str) -> None:
    out = tmp_path / "kvcs.json"
    argv = ["--quick", "--ours-only", "--variants", variant, "--budget", "60", "--json", str(out)]
    code = main(argv)
    doc = json.loads(out.read_text())
    assert doc["argv"] == argv and doc["geometry"] == QUICK and doc["variants"] == [variant]
    assert doc["object_data_bytes"] == QUICK["block_tokens"] * QUICK["kv_heads"] * QUICK["head_dim"] * 2
    assert doc["cache_data_bytes"] == 2 * QUICK["layers"] * QUICK["blocks"] * doc["object_data_bytes"]
    assert any("aiomoqt relay not measured: --ours-only" in s for s in doc["skipped"]), doc["skipped"]
    assert [(r["relay"], r["variant"]) for r in doc["runs"]] == [("kvconform", variant)]
    run = doc["runs"][0]
    assert run["intact"], f"the cache did not arrive intact: {run['error']}"
    assert code == 0 and doc["failures"] == []
    assert run["bad_layers"] == [] and run["rejected"] == 0 and run["publication"] and run["attempts"] >= 1
    assert run["consumer_mode"] == ("live" if variant == "live" else "fetch")
    for key in ("total_s", "first_layer_s", "mb_per_s", "publisher_s"):
        assert isinstance(run[key], float) and run[key] >= 0, (key, run[key])
    assert run["first_layer_s"] <= run["total_s"]
    assert doc["best"] == doc["runs"] and doc["ratio_kvconform_to_aiomoqt"] == {}
