"""The KBTP cell: an initiator stores blocks in a target's pool and loads them back.

Both in-process (reference, ``python:``): on a fresh emulated RDMA fabric (``kvconform.rdma``, seeded by the
cell) of the binding they share, the target on one node with the pool it declares (PICS ``kbtp.target``), the
initiator on another, behind one connection. A side in another process puts the cell on that side's wire
binding over loopback sockets (``kvconform.rdma.wire``), as its suite does: a target at ``kbtp+iwarp://`` /
``kbtp+roce://`` is dialled, a ``cmd:`` initiator (the control channel of ``kvconform.kbtp.control``) is given
the URL of the target, the cell's own listener when the target is in-process. The initiator says HELLO,
ALLOC_STOREs (sealed) one short block (inline) and one longer one (RDMA Write) within its Allocation Quota, LOADs
each back, FREEs them and says GOODBYE; the run is bounded in steps (and, on a wire, in time). Pass: HELLO
accepted, every operation OK and every loaded block byte-identical to what was stored.
"""

from __future__ import annotations

from typing import Any

from kvconform.kbtp.constants import Status
from kvconform.matrix.context import Broken, CellContext, Unavailable
from kvconform.rdma import PROFILES, ActorFailed
from kvconform.rdma.emulated import EmuFabric
from kvconform.targets.drivers import driver_for
from kvconform.targets.kbtp import InitiatorParams, TargetParams
from kvconform.targets.kbtp_wire import SCHEMES
from kvconform.verdicts import TargetUnavailable

__all__ = ["MAX_STEPS", "run"]

MAX_STEPS = 400_000
SIZES = (200, 1024)  # octets: one at most max_inline (256 by default), one above it
INI, TGT = "kbtp-initiator", "kbtp-target"
CONNECT_WAIT_S = 15.0  # from its start to a process initiator's connection to the cell's target


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


def _fabric(ctx: CellContext, target: Any, initiator: Any, tparams: TargetParams) -> Any:
    """A fresh emulated fabric when both sides are in-process; else the wire of the side in another process (a
    remote target's URL scheme first: a cmd: initiator connects to it directly)."""
    for suite, driver in ((TGT, target), (INI, initiator)):
        own = getattr(driver, "make_fabric", None)
        if own is not None:
            try:
                return own(tparams)
            except TargetUnavailable as exc:  # the declared binding is not one this wire carries
                raise Unavailable(suite, str(exc)) from exc
    return EmuFabric(PROFILES[tparams.binding], seed=ctx.seed)


def _initiator(ctx: CellContext, fabric: Any, tnode: Any, driver: Any, endpoint: Any, iparams: InitiatorParams) -> Any:
    """The initiator under way, connected to the target's ``endpoint`` on ``tnode`` (dialled when it is remote)."""
    inode = fabric.node("initiator")
    dial = getattr(endpoint, "dial", None)  # a target in another process: connections are dialled
    launch = getattr(driver, "launch", None)  # an initiator in another process: it connects by itself
    if launch is None:
        try:
            if dial is not None:
                i_conn = dial(inode, "matrix-conn")
            else:
                t_conn, i_conn = fabric.connect(tnode, inode, name="matrix")
                endpoint.attach(t_conn)
        except OSError as exc:  # the wire's setup or a socket: no connection ever carried KBTP
            raise Unavailable(TGT, f"no connection to the target: {exc}") from exc
        except Exception as exc:
            raise Broken([TGT], f"the target did not take the initiator's connection: {exc!r}") from exc
        return driver.start(fabric, inode, i_conn, iparams)
    if dial is not None:
        url = ctx.spec(TGT).value
        if url.partition("://")[0] not in SCHEMES:
            raise Unavailable(INI, f"a cmd: initiator reaches a target at {' or '.join(SCHEMES)}://, not {url}")
        return launch(fabric, url, iparams)
    accepted: list[Any] = []

    def on_accept(conn: Any) -> None:
        if not accepted:
            endpoint.attach(conn)
        accepted.append(conn)

    listener = fabric.listen(tnode, "127.0.0.1", 0, on_accept)
    url = f"kbtp+{fabric.binding}://127.0.0.1:{fabric.port_of(listener)}"
    started = launch(fabric, url, iparams)
    if not fabric.await_event(lambda: bool(accepted), CONNECT_WAIT_S):
        started.close()
        raise Unavailable(INI, f"the initiator did not connect to the cell's target at {url} within "
                               f"{CONNECT_WAIT_S:g} s")
    return started


def run(ctx: CellContext) -> None:
    """initiator x target (see the module docstring)."""
    bindings = [v for v in ctx.part(INI).versions if v in ctx.part(TGT).versions and v in PROFILES]
    binding = str(bindings[0])
    tparams = TargetParams.from_pics(dict(ctx.part(TGT).pics.get("kbtp", {}).get("target", {}))).with_(binding=binding)
    iparams = InitiatorParams.from_pics({**ctx.part(INI).pics.get("kbtp", {}).get("initiator", {}), "binding": binding})
    drivers: dict[str, Any] = {}
    for suite in (TGT, INI):
        try:
            drivers[suite] = driver_for(suite, ctx.spec(suite))
        except TargetUnavailable as exc:
            raise Unavailable(suite, str(exc)) from exc
    fabric = _fabric(ctx, drivers[TGT], drivers[INI], tparams)
    ini: Any = None
    try:
        tnode = fabric.node("target")
        try:
            endpoint = drivers[TGT].start(fabric, tnode, tparams)
        except TargetUnavailable as exc:
            raise Unavailable(TGT, str(exc)) from exc
        except Exception as exc:  # a target that cannot start on what it declares broke the exchange
            raise Broken([TGT], f"the target did not start with its declared PICS ({tparams}): {exc!r}") from exc
        try:
            ini = _initiator(ctx, fabric, tnode, drivers[INI], endpoint, iparams)
        except (Unavailable, Broken):
            raise
        except TargetUnavailable as exc:
            raise Unavailable(INI, str(exc)) from exc
        except Exception as exc:
            raise Broken([INI], f"the initiator did not start: {exc!r}") from exc
        _exchange(ctx, fabric, ini, tparams, binding)
    finally:
        close = getattr(ini, "close", None)  # a process initiator: stopped, its output into the evidence
        if close is not None:
            close()
        close = getattr(fabric, "close", None)  # a wire fabric's sockets
        if close is not None:
            close()


def _exchange(ctx: CellContext, fabric: Any, ini: Any, tparams: TargetParams, binding: str) -> None:
    rng = ctx.rng
    quota = tparams.quota or len(SIZES)
    blocks = [rng.randbytes(min(size, tparams.block_size)) for size in SIZES[:max(1, min(quota, len(SIZES)))]]
    ctx.identifiers.update(binding=binding, fabric_seed=ctx.seed)
    ctx.step("fabric ready", binding=binding, wire=getattr(fabric, "binding", "emulated"), target=str(tparams),
             blocks=[len(b) for b in blocks])
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
    if result.reason in ("max_steps", "deadline") or not handle.done:
        bound = f"{MAX_STEPS} steps" if result.reason != "deadline" else f"{fabric.run_timeout:g} s"
        raise Broken([INI, TGT], f"the exchange did not settle within {bound} (still waiting: "
                             f"{getattr(handle, 'waiting', None)!r}; blocked {list(result.blocked)})")
    if handle.result is not None:
        raise Broken([INI, TGT], str(handle.result))
    ctx.step("verified", stored=len(blocks), loaded=len(blocks))
