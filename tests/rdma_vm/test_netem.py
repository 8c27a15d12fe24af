"""The netem option of the VM runs (kvconform.testbeds.rdma_vm.netem): parsing and the commands it builds, no VM
(in the default run: not marked rdma_vm)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvconform.fixtures.kbtp import pytest_kvconform_report_meta as report_meta
from kvconform.rdma.wire.impair import GRID, NETEM_ENV, ImpairmentError
from kvconform.testbeds.rdma_vm.netem import VM_ENV, Netem, vm_env
from kvconform.testbeds.rdma_vm.run import netem_prefix
from tests.mutants.runner import ROOT


@pytest.mark.parametrize(("point", "args"), [
    ("loss", "loss 1%"),
    ("dup", "duplicate 1%"),
    ("delay", "delay 5ms"),
    # no delay to jump: 1 % held back 2 ms (netem's "reorder P" sends P at once and delays the rest)
    ("reorder", "delay 2ms reorder 99%"),
    ("together", "loss 1% duplicate 1% delay 5ms reorder 1%"),
])
def test_grid_points_become_netem_arguments(point: str, args: str) -> None:
    assert " ".join(Netem.parse(GRID[point]).args()) == args


def test_the_impair_grammar_is_accepted() -> None:
    assert Netem.parse("loss=1%,dup=0.5%,delay=0.01s").args() == ["loss", "1%", "duplicate", "0.5%", "delay", "10ms"]
    assert Netem.parse("reorder=0.25,hold=3ms").args() == ["delay", "3ms", "reorder", "75%"]


@pytest.mark.parametrize(("spec", "why"), [
    ("loss=0.01,seed=7", "no seed"),
    ("split=0.1", "split"),
    ("loss=2", "between 0 and 1"),
    ("jitter=3ms", "expected NAME=VALUE"),
    ("", "nothing to do"),
])
def test_what_netem_cannot_do_is_refused(spec: str, why: str) -> None:
    with pytest.raises(ImpairmentError, match=why):
        Netem.parse(spec)


def test_the_description_says_what_and_where() -> None:
    text = Netem.parse(GRID["together"]).describe("lo")
    assert text.startswith("tc netem loss 1% duplicate 1% delay 5ms reorder 1% on lo"), text
    assert "unseeded" in text


def test_vm_commands_carry_the_arguments() -> None:
    netem = Netem.parse(GRID["together"])
    assert vm_env(None) == ""
    assert vm_env(netem) == f"{VM_ENV}='loss 1% duplicate 1% delay 5ms reorder 1%' "
    prefix = netem_prefix(netem, ["lo", "eth0"])
    assert prefix.splitlines() == [f"export {VM_ENV}='loss 1% duplicate 1% delay 5ms reorder 1%'",
                                   ". testbeds/rdma-vm/netem.sh", "netem_apply lo eth0 || exit 1"]


def test_the_vm_script_applies_and_records(tmp_path: Path) -> None:
    """testbeds/rdma-vm/netem.sh with tc and modprobe stubbed: the qdisc goes on each device, the description
    is exported for the report's meta and written to the evidence; without the variable nothing happens."""
    bin_dir, results = tmp_path / "bin", tmp_path / "results"
    bin_dir.mkdir()
    results.mkdir()
    for tool in ("tc", "modprobe"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/calls"\n')
        (bin_dir / tool).chmod(0o755)
    script = '. testbeds/rdma-vm/netem.sh && netem_apply lo eth1 && netem_stats after && echo "$KVCONFORM_NETEM"'
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "KVCONFORM_VM_RUN": str(tmp_path), VM_ENV: "loss 1% delay 5ms"}
    out = subprocess.run(["sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[:3] == ["modprobe sch_netem", "tc qdisc replace dev lo root netem loss 1% delay 5ms",
                         "tc qdisc show dev lo"], calls
    assert "tc qdisc replace dev eth1 root netem loss 1% delay 5ms" in calls
    assert calls[-2:] == ["tc -s qdisc show dev lo", "tc -s qdisc show dev eth1"], calls
    said = "tc netem loss 1% delay 5ms on lo eth1 in the VM"
    assert out.stdout.splitlines()[-1].startswith(said), out.stdout
    assert (results / "netem.txt").read_text().startswith(said)
    del env[VM_ENV]
    (tmp_path / "calls").unlink()
    out = subprocess.run(["sh", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0 and not (tmp_path / "calls").exists(), out


class _Config:
    def __init__(self, impair: str | None) -> None:
        self.impair = impair

    def getoption(self, name: str, default: object = None) -> object:
        return self.impair if name == "kvconform_impair" else default


def test_a_report_records_what_the_link_did(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """coverage.json meta: the harness's seeded --impair and the testbed's netem from the run's environment."""
    monkeypatch.delenv(NETEM_ENV, raising=False)
    assert report_meta(_Config(None), tmp_path) is None  # type: ignore[arg-type]
    said = Netem.parse(GRID["loss"]).describe("lo")
    monkeypatch.setenv(NETEM_ENV, said)
    assert report_meta(_Config("loss=0.01,seed=3"), tmp_path) == {  # type: ignore[arg-type]
        "impair": "loss=0.01,seed=3", "netem": said}
