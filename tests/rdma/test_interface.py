"""The emulated binding satisfies the abstract interface that KBTP endpoints are written against."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kvconform.rdma import (
    PROFILES,
    RDMAP_7306,
    Access,
    Buffer,
    CompletionQueue,
    Connection,
    EmuFabric,
    Fabric,
    Node,
    PlacementModel,
    fabric,
)


def test_emulated_classes_are_the_protocols() -> None:
    # mypy checks these assignments statically; the asserts check them at run time
    fab: Fabric = EmuFabric()
    a: Node = fab.node("A")
    b: Node = fab.node("B")
    ca, cb = fab.connect(a, b)
    conn: Connection = ca
    cq: CompletionQueue = conn.cq
    buf: Buffer = a.alloc(16)
    assert isinstance(buf, Buffer)
    assert (conn.name, cb.name, conn.peer_name, cq.name) == ("A-B.A", "A-B.B", "A-B.B", "A-B.A.cq")
    assert a.connection("A-B.A") is conn and conn.node is a
    region = a.register(buf, Access.LOCAL_WRITE)
    assert region.node == "A" and region.to(4) == buf.addr + 4


def test_profiles_declare_what_kbtp_derives_its_choices_from() -> None:
    rdmap = PROFILES["rdmap-7306"]
    ib = PROFILES["ib-rc"]
    assert (rdmap.masked_atomics, rdmap.immediate_bytes, rdmap.placement_model) == (True, 8, PlacementModel.RDMAP)
    assert (ib.masked_atomics, ib.immediate_bytes, ib.placement_model) == (False, 4, PlacementModel.IB_PSN_ORDER)
    assert not PROFILES["rdmap-5040"].atomics
    assert RDMAP_7306.with_(chunk_bytes=1).chunk_bytes == 1 and RDMAP_7306.chunk_bytes == 8


def test_stags_are_distinct_and_carry_a_key_byte() -> None:
    fab = EmuFabric()
    n = fab.node("N")
    stags = {n.register(n.alloc(8), Access.LOCAL_WRITE).stag for _ in range(300)}
    assert len(stags) == 300 and len({s & 0xFF for s in stags}) > 1


def test_module_docstring_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example KBTP authors copy from must work, under many seeds."""
    doc = fabric.__doc__ or ""
    block = doc.split("Send with Invalidate)::\n", 1)[1].split("\nAddresses:", 1)[0]
    code = textwrap.dedent(block)
    monkeypatch.chdir(tmp_path)
    for seed in range(40):
        exec(compile(code.replace("seed=7", f"seed={seed}"), "fabric-example", "exec"), {})
    first = (tmp_path / "trace.jsonl").read_text().splitlines()
    assert json.loads(first[0])["seed"] == 39 and len(first) > 8
