"""KBTP cells across processes: a ``cmd:`` initiator and a target at ``kbtp+iwarp://`` make cells, as the role table
says they reach their suites (targets/registry.py ROLES), on the wire of the side in another process.

Two initiators (the reference in-process, the reference as a ``kvconform serve kbtp-initiator`` process) x two
targets (the reference in-process, a ``kvconform serve kbtp-target`` reached by URL): four cells, every way the two
sides can meet (emulated fabric; the cell's own listener; dialled; the process dialling the served target itself).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.served import served
from tests.spawn import covering

from .helpers import MATRIX_BOUND, cells, run_matrix, validate, write_registry

BINDING = "rdmap-7306"
FEATURES = ["DIRECT_LOAD", "DIRECT_ALLOC", "ADDR_LE"]
TARGET_PICS = {"kbtp": {"target": {"binding": BINDING, "features": FEATURES,
                                   "pool": {"block_size": 4096, "blocks": 22, "shared_blocks": 6, "ring_slots": 8},
                                   "quota": 2, "handle_count": 64, "max_initiators": 4, "max_inline": 256}}}
INITIATOR_PICS = {"kbtp": {"initiator": {"binding": BINDING, "features": FEATURES}}}
INITIATOR_CMD = (f"{sys.executable} -m kvconform serve kbtp-initiator --target {{target}} --profile {BINDING} "
                 "--initiator-id {initiator_id} --features={features}")
OPERATIONS = ["HELLO", "ALLOC_STORE", "ALLOC_STORE", "LOAD", "LOAD", "FREE", "FREE", "GOODBYE"]


def _registry(url: str) -> dict[str, Any]:
    def role(**form: Any) -> dict[str, Any]:
        return {"versions": [BINDING], **form}

    return {"name": "kbtp-wire", "implementations": {
        "kvconform": {"reference": True, "roles": {"kbtp": {
            "initiator": role(reference=True, pics=INITIATOR_PICS), "target": role(reference=True, pics=TARGET_PICS)}}},
        "process": {"roles": {"kbtp": {"initiator": role(cmd=INITIATOR_CMD, pics=INITIATOR_PICS)}}},
        "served": {"roles": {"kbtp": {"target": role(url=url, pics=TARGET_PICS)}}},
    }}


@covering(MATRIX_BOUND)
def test_a_cmd_initiator_and_a_url_target_make_cells_over_the_wire(tmp_path: Path) -> None:
    with served("kbtp-target", "--binding", "iwarp", "--port", "0", "--profile", BINDING,
                f"--features={','.join(FEATURES)}") as address:
        url = f"kbtp+iwarp://{address}"
        registry = write_registry(tmp_path, _registry(url))
        code, doc, output = run_matrix(registry, tmp_path / "out", "--no-suites", "--roles", "kbtp", "-n", "2",
                                       "--seed", "3")
    validate(doc)
    by_id = cells(doc)
    assert set(by_id) == {f"kbtp--{i}--{t}" for i in ("kvconform", "process") for t in ("kvconform", "served")}
    for cell in by_id.values():
        assert cell["outcome"] == "pass", (cell["id"], cell["exchange"]["message"], output[-3000:])
    assert code == 0
    wires = {}
    for cid in by_id:
        result = json.loads((tmp_path / "out" / "cells" / cid / "result.json").read_text("utf-8"))
        assert [op["op"] for op in result["exchanged"]["operations"]] == OPERATIONS, cid
        wires[cid] = next(s["wire"] for s in result["steps"] if s["what"] == "fabric ready")
    assert wires == {"kbtp--kvconform--kvconform": "emulated", "kbtp--process--kvconform": "iwarp",
                     "kbtp--kvconform--served": "iwarp", "kbtp--process--served": "iwarp"}
    log = (tmp_path / "out" / "cells" / "kbtp--process--kvconform" / "kbtp-initiator.process.log").read_text("utf-8")
    assert "==== initiator process: argv" in log and "'kbtp-initiator'" in log, log
