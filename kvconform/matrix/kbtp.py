"""The KBTP cell: an initiator stores blocks in a target's pool and loads them back, on the emulated fabric.

Both run on a fresh in-process emulated RDMA fabric (``kvconform.rdma``, seeded by the cell) of the binding
they share: the target on one node with the pool it declares (PICS ``kbtp.target``), the initiator on another,
behind one connection. The initiator says HELLO, ALLOC_STOREs (sealed) one short block (inline) and one
longer one (RDMA Write) within its Allocation Quota, LOADs each back, FREEs them and says GOODBYE; the run is
bounded in steps. Pass: HELLO accepted, every operation OK and every loaded block byte-identical to what was
stored. The wire bindings (RoCEv2, iWARP) come with another issue; this is the fabric the suites use.
"""

from __future__ import annotations

from typing import Any

from kvconform.kbtp.constants import Status
from kvconform.matrix.context import Broken, CellContext, Unavailable
from kvconform.rdma import PROFILES, ActorFailed
from kvconform.rdma.emulated import EmuFabric
from kvconform.targets.kbtp import InitiatorParams, TargetParams
from kvconform.targets.registry import driver_for
from kvconform.verdicts import TargetUnavailable

__all__ = ["MAX_STEPS", "run"]

MAX_STEPS = 400_000
SIZES = (200, 1024)  # octets: one at most max_inline (256 by default), one above it
INI, TGT = "kbtp-initiator", "kbtp-target"


def _scenario(ini: Any, blocks: list[bytes], ops: list[dict[str, Any]]) -> Any:
    features = yield from ini.hello()
    ops.append({"op": "HELLO", "granted": repr(features)})
    if features is None:
        return "HELLO was refused"
    base = ini.handle_base
    for what in ("ALLOC_STORE", "LOAD", "FREE"):
        for i, data in enumerate(blocks):
            if what == "ALLOC_STORE":
                result = yield from ini.alloc_store(base + i, data, seal=True)
            elif what == "LOAD":
                result = yield from ini.load(base + i, len(data))
            else:
                result = yield from ini.free(base + i)
            entry = {"op": what, "handle": base + i, "status": repr(result.status), "detail": result.detail}
            ops.append(entry)
            if result.status != Status.OK:
                return f"{what} of handle {base + i} ended {result.status!r}, expected OK {result.detail}".rstrip()
            if what == "LOAD":
                entry["octets"] = len(result.data or b"")
                if result.data != data:
                    got = result.data or b""
                    at = next((k for k, (x, y) in enumerate(zip(got, data, strict=False)) if x != y), min(len(got),
                                                                                                         len(data)))
                    return (f"LOAD of handle {base + i} returned {len(got)} octets that differ from the {len(data)} "
                            f"stored, first at offset {at}")
    yield from ini.goodbye()
    ops.append({"op": "GOODBYE"})
    return None


def run(ctx: CellContext) -> None:
    """initiator x target (see the module docstring)."""

    bindings = [v for v in ctx.part(INI).versions if v in ctx.part(TGT).versions and v in PROFILES]
    binding = str(bindings[0])
    tparams = TargetParams.from_pics(dict(ctx.part(TGT).pics.get("kbtp", {}).get("target", {}))).with_(binding=binding)
    iparams = InitiatorParams.from_pics({**ctx.part(INI).pics.get("kbtp", {}).get("initiator", {}), "binding": binding})
    fabric = EmuFabric(PROFILES[binding], seed=ctx.seed)
    tnode, inode = fabric.node("target"), fabric.node("initiator")
    try:
        endpoint = driver_for(TGT, ctx.spec(TGT)).start(fabric, tnode, tparams)
    except TargetUnavailable as exc:
        raise Unavailable(TGT, str(exc)) from exc
    except Exception as exc:  # a target that cannot start on what it declares broke the exchange
        raise Broken([TGT], f"the target did not start with its declared PICS ({tparams}): {exc!r}") from exc
    t_conn, i_conn = fabric.connect(tnode, inode, name="matrix")
    try:
        endpoint.attach(t_conn)
    except Exception as exc:
        raise Broken([TGT], f"the target did not take the initiator's connection: {exc!r}") from exc
    try:
        ini = driver_for(INI, ctx.spec(INI)).start(fabric, inode, i_conn, iparams)
    except TargetUnavailable as exc:
        raise Unavailable(INI, str(exc)) from exc
    except Exception as exc:
        raise Broken([INI], f"the initiator did not start: {exc!r}") from exc
    rng = ctx.rng
    quota = tparams.quota or len(SIZES)
    blocks = [rng.randbytes(min(size, tparams.block_size)) for size in SIZES[:max(1, min(quota, len(SIZES)))]]
    ctx.identifiers.update(binding=binding, fabric_seed=ctx.seed)
    ctx.step("fabric ready", binding=binding, target=str(tparams), blocks=[len(b) for b in blocks])
    ops: list[dict[str, Any]] = []
    ctx.exchanged["operations"] = ops
    handle = fabric.spawn("matrix-initiator", _scenario(ini, blocks, ops))
    try:
        result = fabric.run(max_steps=MAX_STEPS)
    except ActorFailed as exc:
        who = INI if exc.actor == "matrix-initiator" else TGT
        raise Broken([who], f"{'the initiator' if who == INI else f'the target (actor {exc.actor!r})'} raised "
                            f"{exc.cause!r} at fabric step {exc.step} (seed {exc.seed})") from exc
    ctx.step("fabric settled", steps=result.steps, reason=result.reason)
    if result.reason == "max_steps" or not handle.done:
        raise Broken([INI, TGT], f"the exchange did not settle within {MAX_STEPS} steps (still waiting: "
                             f"{getattr(handle, 'waiting', None)!r}; blocked {list(result.blocked)})")
    if handle.result is not None:
        raise Broken([INI, TGT], str(handle.result))
    ctx.step("verified", stored=len(blocks), loaded=len(blocks))
