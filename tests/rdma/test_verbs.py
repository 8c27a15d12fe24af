"""The verbs binding where there is no device (these machines' own kernel): what it decides before it touches a
device, and that without pyverbs or a device everything says why in one line instead of crashing or judging.

The binding on real devices (rxe0, siw0) is exercised inside the testbed VM by `.ci/rdma`
(testbeds/rdma-vm/verbs_contract.py and the KBTP suites, testbeds/rdma-vm/suites.sh)."""

from __future__ import annotations

import errno
import json
import os
import socket
import struct
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvconform import cli
from kvconform.components.kbtp import serve_kbtp_target
from kvconform.rdma import (
    IB_RC,
    IB_RC_MASKED,
    RDMAP_7306,
    RDMAP_NO_ATOMICS,
    ConnState,
    Layer,
    Op,
    RdmapCode,
    RdmapEType,
    Status,
)
from kvconform.rdma.verbs import cm
from kvconform.rdma.verbs.device import DeviceInfo, VerbsUnavailable, discover, profile_for, skip_reason
from kvconform.rdma.verbs.engine import (
    WC_WITH_IMM,
    WC_WITH_INV,
    VerbsEngine,
    imm_from_wire,
    imm_to_wire,
    terminate_for,
)
from kvconform.rdma.verbs.fabric import CM_REDIALS, VerbsFabric
from kvconform.targets.drivers import driver_for
from kvconform.targets.kbtp_verbs import VerbsInitiatorDriver, VerbsRemoteTargetDriver, VerbsTargetDriver
from kvconform.targets.kbtp_wire import target_from_url
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import load_testbed
from kvconform.verdicts import TargetUnavailable

REPO = Path(__file__).resolve().parents[2]
VM_TESTBED = REPO / "testbeds" / "rdma-vm.yaml"

try:
    import pyverbs  # noqa: F401

    HAVE_PYVERBS = True
except ImportError:
    HAVE_PYVERBS = False
no_pyverbs = pytest.mark.skipif(HAVE_PYVERBS, reason="this host has pyverbs: the no-pyverbs paths do not apply")


def device(name: str = "rxe0", **kw: object) -> DeviceInfo:
    base: dict[str, object] = dict(name=name, transport="roce", port=1, port_active=True, active_mtu=4096,
                                   atomic_caps=1, max_mw=1 << 19, max_qp_rd_atom=128, max_sge=32, gid_index=1,
                                   gid_address="127.0.0.1")
    base.update(kw)
    return DeviceInfo(**base)  # type: ignore[arg-type]


SIW = device("siw0", transport="iwarp", active_mtu=1024, atomic_caps=0, max_mw=0, max_sge=6, gid_index=None,
             gid_address=None)


# ---- what the device can carry of the declared profile ------------------------------------------------------

def test_rxe_carries_the_ib_profile_with_windows_and_its_mtu() -> None:
    p = profile_for(device(active_mtu=1024), IB_RC.with_(pmtu=4096))
    assert (p.binding, p.atomics, p.masked_atomics, p.mw_type2, p.pmtu) == (IB_RC.binding, True, False, True, 1024)


def test_siw_carries_rdmap_without_atomics_and_says_it_has_no_windows() -> None:
    p = profile_for(SIW, RDMAP_NO_ATOMICS)
    assert (p.atomics, p.mw_type2, p.immediate_bytes) == (False, False, 0)


@pytest.mark.parametrize(("info", "declared", "names"), [
    (SIW, RDMAP_7306, "has atomics, device siw0 has none"),
    (SIW, IB_RC, "device siw0 is iwarp, but binding ib-rc is ib"),
    (device(), RDMAP_NO_ATOMICS, "device rxe0 is roce, but binding rdmap-5040 is rdmap"),
    (device(), IB_RC_MASKED, "masked FetchAdd, which the verbs API does not reach"),
    (device(atomic_caps=0), IB_RC, "has atomics, device rxe0 has none"),
])
def test_a_declaration_the_device_cannot_carry_is_refused_naming_both(info: DeviceInfo, declared: object,
                                                                      names: str) -> None:
    with pytest.raises(VerbsUnavailable, match=names):
        profile_for(info, declared)  # type: ignore[arg-type]


def test_siw_does_not_report_remote_invalidation_rxe_does() -> None:
    assert (device().reports_invalidation, SIW.reports_invalidation) == (True, False)
    assert "memory windows no" in SIW.describe() and "atomics no" in SIW.describe()


# ---- work completions and work requests as the device has them ------------------------------------------------

def test_immediate_data_keeps_its_wire_order_through_the_host_integer() -> None:
    imm = b"\x01\x02\x03\x04"
    assert struct.pack("=I", imm_to_wire(imm)) == imm  # ibv_send_wr.imm_data is __be32: the octets as they travel
    assert imm_from_wire(imm_to_wire(imm)) == imm


def test_invalidation_is_read_from_either_flag_bit() -> None:
    assert WC_WITH_INV & 0x8 and WC_WITH_INV & 0x4  # libibverbs' bit 3, and bit 2 as rxe sets it
    assert not WC_WITH_INV & WC_WITH_IMM


def test_an_error_completion_becomes_the_terminate_it_stands_for() -> None:
    t = terminate_for(Status.REM_ACCESS_ERR, "I-conn.I", vendor_err=0x12)
    assert t.key() == (Layer.RDMAP, RdmapEType.REMOTE_PROTECTION, RdmapCode.INVALID_STAG)
    assert "REM_ACCESS_ERR" in t.reason and "0x12" in t.reason and t.sender == "I-conn.I"
    assert terminate_for(Status.REM_INV_REQ_ERR, "x").etype == RdmapEType.REMOTE_OPERATION


def test_a_flush_the_device_never_delivers_ends_as_flushed_after_the_bound(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """siw once kept an ended connection's send unreturned for the rest of a run: the engine waits FLUSH_BOUND_S,
    then completes what is left as flushed, names it on stderr, and is drained (a run can end)."""
    from kvconform.rdma.engine import WorkRequest
    from kvconform.rdma.verbs import engine as verbs_engine

    class SilentCQ:
        def poll(self, n: int) -> tuple[int, list[object]]:
            return 0, []

    eng = object.__new__(verbs_engine.VerbsEngine)  # no device: only the completion bookkeeping runs
    eng._name, eng.cq, eng._state, eng._ended_at = "T-conn.T", SilentCQ(), ConnState.ERROR, None
    eng._sq = {7: verbs_engine._Out(WorkRequest(wr_id=70, op=Op.RDMA_WRITE))}
    eng._rq, eng._backlog, eng._posted, eng._done, eng._free_slots = {8: 80}, deque(), 1, deque(), []
    clock = [100.0]
    monkeypatch.setattr("kvconform.rdma.verbs.engine.time.monotonic", lambda: clock[0])
    assert eng.poll() == 0 and not eng.drained  # the device may still flush
    clock[0] += verbs_engine.FLUSH_BOUND_S + 0.1
    assert eng.poll() == 1 and eng.drained
    done = {(c.wr_id, c.op, c.status) for c in eng.take_completions()}
    assert done == {(70, Op.RDMA_WRITE, Status.WR_FLUSH_ERR), (80, Op.RECV, Status.WR_FLUSH_ERR)}
    err = capsys.readouterr().err
    assert "T-conn.T" in err and "RDMA_WRITE" in err and "1 receives" in err
    assert eng.outstanding() == ""


def test_rdma_cm_addresses_are_in_network_order() -> None:
    sa = cm._sockaddr("10.77.0.1", 7471)
    raw = bytes(sa)
    assert struct.unpack_from("=H", raw)[0] == socket.AF_INET
    assert raw[2:4] == (7471).to_bytes(2, "big") and raw[4:8] == bytes([10, 77, 0, 1])
    assert cm.CmEvent.NAMES[cm.CmEvent.ESTABLISHED] == "ESTABLISHED"


class _DialChannel:
    """An rdma_cm event channel that refuses the first ``refusals`` rdma_connect calls with ``err``."""

    def __init__(self, refusals: int, err: int = errno.EADDRNOTAVAIL) -> None:
        self.refusals, self.err = refusals, err
        self.next_id = 100
        self.resolved: list[int] = []
        self.connected: list[int] = []
        self.destroyed: list[int] = []

    def create_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def resolve_addr(self, cm_id: int, host: str, port: int, src: str | None = None) -> None:
        self.resolved.append(cm_id)

    def connect(self, cm_id: int, qpn: int, ord_: int) -> None:
        self.connected.append(cm_id)
        if len(self.connected) <= self.refusals:
            raise cm.CmError(self.err, f"rdma_connect: {os.strerror(self.err)}")

    def destroy_id(self, cm_id: int) -> None:
        self.destroyed.append(cm_id)


def _dialing(ch: _DialChannel) -> tuple[Any, Any]:
    """Just enough of a verbs fabric to run its rdma_connect step (no device here)."""
    fab: Any = SimpleNamespace(_channel=lambda: ch, _cm_conns={}, _note=lambda *a, **k: None,
                               profile=SimpleNamespace(ord=4), host="0.0.0.0")
    fab._cm_resolve = lambda conn: VerbsFabric._cm_resolve(fab, conn)
    engine = VerbsEngine.__new__(VerbsEngine)
    engine.qp = SimpleNamespace(qp_num=7)
    conn: Any = SimpleNamespace(name="I0-conn.I0", engine=engine, dial_to=("10.77.0.1", 7471), redials=0)
    return fab, conn


def test_rdma_connect_refused_for_a_local_port_in_time_wait_dials_again_from_a_new_id() -> None:
    ch = _DialChannel(refusals=1)
    fab, conn = _dialing(ch)
    VerbsFabric._cm_connect(fab, conn, 1)
    assert ch.destroyed == [1] and ch.resolved == [101] and fab._cm_conns == {101: conn} and conn.redials == 1
    VerbsFabric._cm_connect(fab, conn, 101)  # the new id's route resolved: the same QP connects
    assert ch.connected == [1, 101]


def test_rdma_connect_redials_are_bounded_and_other_errors_are_not_retried() -> None:
    ch = _DialChannel(refusals=99)
    fab, conn = _dialing(ch)
    cm_id = 1
    for _ in range(CM_REDIALS):
        VerbsFabric._cm_connect(fab, conn, cm_id)
        cm_id = ch.resolved[-1]
    with pytest.raises(cm.CmError, match="Cannot assign requested address"):
        VerbsFabric._cm_connect(fab, conn, cm_id)
    ch = _DialChannel(refusals=1, err=errno.ECONNREFUSED)
    fab, conn = _dialing(ch)
    with pytest.raises(cm.CmError, match="refused"):
        VerbsFabric._cm_connect(fab, conn, 1)
    assert ch.resolved == [] and ch.destroyed == []


# ---- no device, no pyverbs: one line, never a crash, never a verdict ------------------------------------------

@no_pyverbs
def test_without_pyverbs_discovery_is_empty_and_the_reason_is_one_line() -> None:
    assert discover() == []
    why = skip_reason("rxe0", IB_RC)
    assert why is not None and why.startswith("verbs: pyverbs is not importable") and "\n" not in why
    assert "python3-pyverbs" in why


@no_pyverbs
def test_a_verbs_target_without_pyverbs_is_unavailable_not_judged() -> None:
    driver = VerbsTargetDriver("rxe0")
    with pytest.raises(TargetUnavailable, match="pyverbs is not importable"):
        driver.make_fabric(type("P", (), {"profile": IB_RC})())


@no_pyverbs
def test_the_run_on_the_vm_testbed_is_inconclusive_here_with_the_reason(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    code = cli.main(["run", "kbtp-target", "--testbed", str(VM_TESTBED), "--target", "rxe-ref", "-q",
                     "--report-dir", str(rep), "-k", "test_hello_ack"])
    doc = json.loads((rep / "coverage.json").read_text())
    (test,) = [t for t in doc["tests"] if t["nodeid"].endswith("test_hello_ack")]
    assert test["verdict"] == "inconclusive", test
    assert "pyverbs is not importable" in test["message"]
    assert code != 0 or test["verdict"] != "fail"


@no_pyverbs
def test_serve_on_a_verbs_device_says_why_it_cannot(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve_kbtp_target(["--binding", "verbs"]) == 2
    assert "--binding verbs needs --device" in capsys.readouterr().err
    assert serve_kbtp_target(["--binding", "verbs", "--device", "rxe0"]) == 2
    assert "pyverbs is not importable" in capsys.readouterr().err


# ---- the testbed's verbs entries and URLs reach the verbs drivers ---------------------------------------------

def test_the_vm_testbed_entries_are_verbs_targets_on_their_devices() -> None:
    testbed = load_testbed(str(VM_TESTBED))
    rxe = parse_target("rxe-ref", testbed, [])
    siw = parse_target("siw-ref", testbed, [])
    assert (rxe.kind, rxe.value, siw.value) == ("verbs", "rxe0", "siw0")
    assert siw.params["verbs"]["address"] == "10.77.0.1"
    assert siw.pics["kbtp"]["target"]["binding"] == "rdmap-5040"
    target = driver_for("kbtp-target", siw)
    initiator = driver_for("kbtp-initiator", rxe)
    assert isinstance(target, VerbsTargetDriver) and (target.device, target.address) == ("siw0", "10.77.0.1")
    assert isinstance(initiator, VerbsInitiatorDriver) and initiator.device == "rxe0"
    with pytest.raises(TargetUnavailable, match="cannot play tlkv-writer"):
        driver_for("tlkv-writer", rxe)


def test_a_verbs_url_names_the_harness_device_and_the_target_address() -> None:
    d = target_from_url("kbtp+verbs://10.77.0.1:7471?device=siw0")
    assert isinstance(d, VerbsRemoteTargetDriver)
    assert (d.device, d.host, d.port, d.address) == ("siw0", "10.77.0.1", 7471, None)
    url = "kbtp+verbs://127.0.0.1:18515?device=rxe0&local=127.0.0.2"
    d = target_from_url(url)
    assert isinstance(d, VerbsRemoteTargetDriver) and d.address == "127.0.0.2" and repr(d) == url
    parse_target(url, load_testbed(str(VM_TESTBED)), [])  # the generic URL checks take it as it is
    for bad in ("kbtp+verbs://127.0.0.1:1", "kbtp+verbs://127.0.0.1?device=rxe0",
                "kbtp+verbs://127.0.0.1:1?device=rxe0&mtu=1"):
        with pytest.raises(TargetUnavailable, match="expected kbtp\\+verbs://HOST:PORT\\?device=DEV"):
            target_from_url(bad)


def test_the_verbs_fabric_says_what_it_cannot_see() -> None:
    """What tests/rdma/blind.py stands in for (test_blind_verdicts.py proves the checks honour it)."""
    from kvconform.rdma.verbs.fabric import VerbsFabric
    from tests.rdma.blind import BlindWireFabric

    for flag in ("observes_remote_ops", "crafts_frames"):
        assert getattr(VerbsFabric, flag) is False and getattr(BlindWireFabric, flag) is False
    assert VerbsFabric.invalidates_regions is False


def test_a_verbs_url_keeps_the_device_port_apart_from_the_target_port() -> None:
    """The harness's fabric opens port 1 of the device, not the target's TCP port (a run against
    kbtp+verbs://10.0.2.2:42949 once asked the device for port 42949)."""
    d = target_from_url("kbtp+verbs://10.0.2.2:42949?device=rxe1")
    assert isinstance(d, VerbsRemoteTargetDriver) and (d.device_port, d.port) == (1, 42949)
