"""The README's workflows, end to end, as a user runs them: each through the `kvconform` command."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.served import served
from tests.spawn import covering, kvconform

TIMEOUT = 300
pytestmark = covering(TIMEOUT)  # each test makes one run


@pytest.fixture
def served_decode() -> Iterator[str]:
    """`kvconform serve tlkv-decode` on 127.0.0.1, an ephemeral port; always stopped."""
    with served("tlkv-decode", "--port", "0") as address:
        yield address


def _run(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = kvconform(["run", *args, "--report-dir", str(tmp_path), "-q"], timeout=TIMEOUT)
    doc = json.loads((tmp_path / "coverage.json").read_text())
    return proc.returncode, doc


@pytest.mark.slow
def test_decode_suite_passes_against_the_served_reference(served_decode: str, tmp_path: Path) -> None:
    code, doc = _run(tmp_path, "tlkv", "--target", f"grpc://{served_decode}")
    summary = doc["summary"]
    assert code == 0, summary
    assert set(summary["suites"]) == {"tlkv-decode"}, "a grpc:// target plays the decode suite only"
    assert summary["verdicts"].get("pass", 0) > 30


@pytest.mark.slow
def test_prefill_suite_passes_against_the_spawned_reference_tool(tmp_path: Path) -> None:
    template = f"cmd:{sys.executable} -m kvconform tlkv prefill --decode {{decode_addr}} --sequence {{sequence}}"
    # An ad-hoc target claims only v1 unless it declares more: the reference tool sends v2 too.
    code, doc = _run(tmp_path, "tlkv-prefill", "--target", template, "--pics-set", "tlkv.prefill.versions=[1, 2]")
    assert code == 0, doc["summary"]
    assert doc["summary"]["verdicts"] == {"pass": doc["summary"]["tests"]}


# A spawned tool costs a process per export or import, so these runs take a subset of each suite: enough to
# prove the cmd: contract (placeholders, files, result JSON with allocations, decoded values) end to end. The
# reference tool declares what it does beyond the mandatory (v2; a reader of any geometry, openable as v1-only).
@pytest.mark.slow
@pytest.mark.parametrize(("suite", "tool", "extra"), [
    ("tlkv-writer", "export --sequence {sequence} --out {out}",
     ("--pics-set", "tlkv.writer.versions=[1, 2]", "-k", "B16-tail15 or reserved_zero_hash")),
    ("tlkv-reader", "import --envelope {envelope} --pool {pool} --versions {versions} --out {out}",
     ("--pics-set", "tlkv.reader.versions=[1, 2]", "--pics-set", "tlkv.reader.any_geometry=true",
      "--pics-set", "tlkv.reader.v1_only_mode=true",
      # n_layers != n_kv_heads and block_tokens != head_dim: the shape malformations that swap them exist here
      "--pics-set", "tlkv.reader.geometry={block_tokens: 4, n_layers: 3, n_kv_heads: 2, head_dim: 3}",
      # a process per import: the rules of each field group once (the in-process runs take every rule)
      "-k", "test_rule and (shape or magic- or crc-field or length-extra or last-of-three or version-0) "
            "or test_values or reads_both or refuses")),
])
def test_writer_and_reader_suites_pass_against_the_spawned_reference_tool(suite: str, tool: str,
                                                                          extra: tuple[str, ...],
                                                                          tmp_path: Path) -> None:
    code, doc = _run(tmp_path, suite, "--target", f"cmd:{sys.executable} -m kvconform tlkv {tool}", *extra)
    assert code == 0, doc["summary"]
    assert doc["summary"]["verdicts"] == {"pass": doc["summary"]["tests"]}, "every check ran and passed"
