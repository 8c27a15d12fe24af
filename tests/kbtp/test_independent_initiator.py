"""kbtp-initiator against an initiator the harness did not write its suite against: tests/kbtp/independent_initiator.py,
written from the text alone, whose open choices differ from the reference initiator's (requests pipelined within
the Request Credits, Send with Solicited Event, a memory region per request instead of a window, zero-based LOAD
buffers, inline only up to half of Max Inline, completion records where RECORD_COMPLETION is granted, a direct
allocation's write completed before its BIND). A correct initiator must pass clean wherever its PICS are legal:

- in-process on the emulated fabric across the legal PICS (each binding KBTP runs on, the feature subsets it
  declares, quotas, Max Inline at both ends, small blocks, a shared ring of 2): every check passes or is not
  applicable, nothing inconclusive;
- in its own process (``kvconform serve kbtp-initiator --driver-class ...ServedIndependentInitiator``) over RoCEv2
  with completion records, judged as a black box from the harness target's end (the credit, exposure and
  single-use STag probes), and over iWARP;
- in-process over the userspace wires (``--kbtp-wire``).

The default run takes a bounded sample (GRID's sampled points, the RoCEv2 black box limited to the checks that judge
from outside: ~40 s over two workers); KVCONFORM_GRIDS_FULL=1 (tox -e grids) runs every point whole.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.clean_runs import WIRE, assert_clean
from tests.kbtp.test_pics_grid import pool
from tests.lanes import grid_point
from tests.mutants.runner import Run, run_suite
from tests.spawn import covering

INITIATOR = "python:tests.kbtp.independent_initiator:IndependentInitiator"
SERVED = "tests.kbtp.independent_initiator:ServedIndependentInitiator"
RUN_TIMEOUT_S = 300.0
RDMAP_ALL = "kbtp.initiator.features=[DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE]"
IB_ALL = "kbtp.initiator.features=[DIRECT_LOAD, DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE]"
IB = "kbtp.initiator.binding=ib-rc"


# name -> (PICS over the mutants testbed's defaults: rdmap-7306 with DIRECT_LOAD, DIRECT_ALLOC, ADDR_LE; sampled)
GRID: dict[str, tuple[tuple[str, ...], bool]] = {
    "rdmap-7306-all": ((RDMAP_ALL,), True),
    "ib-rc-all-records": ((IB, IB_ALL), True),
    # no INVALIDATE asked for: completion records on every request, LOADs included
    "ib-rc-records-no-invalidate": ((IB, IB_ALL, "kbtp.initiator.requests_invalidate=false"), True),
    # RDMAP without RFC 7306: no DIRECT_ALLOC there (declared anyway in the next point: not applicable)
    "rdmap-5040-direct-load": (("kbtp.initiator.binding=rdmap-5040", "kbtp.initiator.features=[DIRECT_LOAD, ADDR_LE]"),
                               True),
    "rdmap-5040-all-declared": (("kbtp.initiator.binding=rdmap-5040", RDMAP_ALL), False),
    "ib-rc-masked-all": (("kbtp.initiator.binding=ib-rc-masked", IB_ALL), False),
    "ib-rc-no-feature-quota-1": ((IB, "kbtp.initiator.features=[]", "kbtp.target.quota=1"), False),
    "no-feature": (("kbtp.initiator.features=[]",), False),
    "direct-load-only": (("kbtp.initiator.features=[DIRECT_LOAD]",), False),
    "direct-alloc-only": (("kbtp.initiator.features=[DIRECT_ALLOC]",), False),
    "addr-le-only": (("kbtp.initiator.features=[ADDR_LE]",), False),
    "quota-1": (("kbtp.target.quota=1",), False),
    "quota-4": (("kbtp.target.quota=4",), False),
    # Max Inline at both ends: every store by RDMA Read; stores of 2000 octets inline (test_single_use_stags)
    "max-inline-0": (("kbtp.target.max_inline=0",), False),
    "max-inline-4096": (("kbtp.target.max_inline=4096",), True),
    "blocks-of-512": ((pool(8, 5, 8, block_size=512), "kbtp.initiator.features=[DIRECT_LOAD, ADDR_LE]"), False),
    "blocks-of-256": ((pool(22, 6, 8, block_size=256),), False),
    "shared-ring-of-2": ((pool(22, 2, 2),), False),
    "no-invalidate": (("kbtp.initiator.requests_invalidate=false",), False),
    "wide-sweep": ((), False),  # every Request Credits value of test_request_credits (--sweep wide)
}


def _judge(run: Run, what: str, *, reasons: tuple[str, ...] = ()) -> None:
    # On the emulated fabric nothing may be inconclusive (reasons ()); over a wire what tests/clean_runs.py documents.
    assert_clean(run, what, reasons=reasons, least_passed=12)  # no feature: 12 checks apply
    assert run.code == 0, f"{what}: exit {run.code}\n{run.output}"


@pytest.mark.slow
@covering(RUN_TIMEOUT_S)
@pytest.mark.parametrize("name", [grid_point(n, id=n, sampled=s) for n, (_, s) in GRID.items()])
def test_independent_initiator_passes(name: str, tmp_path: Path) -> None:
    pics, _ = GRID[name]
    extra = ("--sweep", "wide") if name == "wide-sweep" else ()
    run = run_suite("kbtp-initiator", INITIATOR, tmp_path, pics=pics, timeout=RUN_TIMEOUT_S, extra=extra)
    _judge(run, f"kbtp-initiator against the independent initiator ({name}: {pics})")


# The checks that judge an initiator in another process from the harness target's end of the wire: its Completion
# Credits (targets/kbtp_credits.py), its outstanding requests (completion records counted as answers), its STags
# (conformance/kbtp/exposure.py) and its ADDR_LE descriptors. The default run takes them over RoCEv2 alone.
BLACK_BOX_CHECKS = ("test_hello_credits_posted", "test_request_credits", "test_single_use_stags",
                    "test_exposes_only_described_buffers", "test_addr_le_requests")
PROFILE = {"roce": ("ib-rc", IB_ALL), "iwarp": ("rdmap-7306", RDMAP_ALL)}


@pytest.mark.slow
@covering(RUN_TIMEOUT_S)
@pytest.mark.parametrize(("wire", "whole"), [grid_point("roce", False, id="roce-black-box-checks", sampled=True),
                                             grid_point("roce", True, id="roce", sampled=False),
                                             grid_point("iwarp", True, id="iwarp", sampled=False)])
def test_independent_initiator_passes_as_a_process(wire: str, whole: bool, tmp_path: Path) -> None:
    profile, features = PROFILE[wire]
    template = (f"cmd:{sys.executable} -m kvconform serve kbtp-initiator --target {{target}} --profile {profile} "
                f"--features={{features}} --driver-class {SERVED}")
    # a process per interleaving of the direct-load race: 16, as for the reference (tests/kbtp/test_wire_suites.py)
    pics = (f"kbtp.initiator.binding={profile}", features, "kbtp.initiator.interleavings=16")
    run = run_suite("kbtp-initiator", template, tmp_path, pics=pics, timeout=RUN_TIMEOUT_S,
                    checks=() if whole else BLACK_BOX_CHECKS)
    what = f"kbtp-initiator against the independent initiator as a process over {wire}"
    assert_clean(run, what, reasons=WIRE, least_passed=len(BLACK_BOX_CHECKS))
    assert run.code == 0, f"{what}: exit {run.code}\n{run.output}"
    passed = {t["nodeid"].split("::")[-1].split("[")[0]: t for t in run.coverage["tests"] if t["verdict"] == "pass"}
    # judged from outside, as a black box: the probes ran (not the in-process views of its node)
    assert "black box" in passed["test_single_use_stags"].get("message", ""), passed["test_single_use_stags"]
    assert "black box" in passed["test_exposes_only_described_buffers"].get("message", "")


@pytest.mark.slow
@covering(RUN_TIMEOUT_S)
@pytest.mark.parametrize("wire", [grid_point(w, id=w, sampled=False) for w in ("roce", "iwarp")])
def test_independent_initiator_passes_over_loopback_sockets(wire: str, tmp_path: Path) -> None:
    profile, features = PROFILE[wire]
    run = run_suite("kbtp-initiator", INITIATOR, tmp_path, pics=(f"kbtp.initiator.binding={profile}", features),
                    timeout=RUN_TIMEOUT_S, extra=("--kbtp-wire", wire))
    _judge(run, f"kbtp-initiator against the independent initiator over {wire}", reasons=WIRE)


def test_it_shares_no_protocol_code_with_the_reference() -> None:
    """Its encoding and logic are its own: of kvconform it imports the semantic RDMA interface, the driver
    interface of targets/kbtp.py and the two enums results are expressed in, nothing of the reference's codec,
    initiator, ring or constants beyond those."""
    tree = ast.parse((Path(__file__).parent / "independent_initiator.py").read_text())
    imported = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                for alias in node.names if node.module and node.module.startswith("kvconform")}
    modules = {m for m, _ in imported}
    assert modules <= {"kvconform.rdma", "kvconform.targets.kbtp", "kvconform.kbtp.constants"}, modules
    assert {n for m, n in imported if m == "kvconform.kbtp.constants"} == {"Features", "Status"}
    assert {n for m, n in imported if m == "kvconform.targets.kbtp"} <= {
        "InitiatorParams", "OpResult", "ReferenceInitiatorDriver"}
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import) and any(
        a.name.startswith("kvconform") for a in n.names)]
