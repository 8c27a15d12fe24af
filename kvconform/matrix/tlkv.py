"""The TLKV cells: a prefill side transfers a sequence to a decode side; a writer's envelope goes to a reader.

**Transfer** (prefill x decode): the decode side is started (its own free port) with the pool geometry it
declares (PICS ``tlkv.decode.geometry``); the prefill side is given a sequence file of that geometry (3 full
blocks and a partial tail; tokens, values and request id fresh per cell) in the highest envelope version both
speak, and transfers it. Then the harness asks the decode side itself, over tl.kv.v1: HasBlocks of every full
block's hash must answer held, and of the reserved hash 0 and of a hash never sent must answer not held.
tl.kv.v1 cannot show the values a decode side holds; what it held is what is checked.

**Envelope** (writer x reader): the writer exports the sequence as one envelope; the reader imports it into a
pool of the sequence's geometry. Its outcome must be "ok" with every block's hash and fill, and (when it shows
its values) every value must be what the envelope's version says the writer should have written (v1 the f16
values, v2 their e4m3 quantisation; zero past the tail's fill). A reader that cannot show values leaves the
cell inconclusive.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvconform import evidence
from kvconform.matrix.context import Broken, CellContext, Unavailable, Unobservable
from kvconform.targets.drivers import driver_for
from kvconform.tlkv.blockhash import block_fills, block_hashes, chain_hashes
from kvconform.tlkv.content import make_kv, write_sequence
from kvconform.tlkv.envelope import encode_sequence
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.reader import read_envelope
from kvconform.verdicts import DriverError, TargetUnavailable

__all__ = ["PREFILL_TIMEOUT_S", "run_envelope", "run_transfer"]

PREFILL_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 10.0
FULL_BLOCKS = 3
DEFAULT_GEOMETRY = {"block_tokens": 16, "n_layers": 32, "n_kv_heads": 8, "head_dim": 128}  # the loopback default
ENVELOPE_GEOMETRY = {"block_tokens": 16, "n_layers": 3, "n_kv_heads": 2, "head_dim": 8}


def _not_started(ctx: CellContext, suite: str, what: str) -> int | None:
    """The exit status of the last ``what`` process a driver ran, when it says the command could not run."""

    transcript = evidence.current()
    events = [e for e in (transcript.as_list() if transcript else []) if e["kind"] == f"{what} process"]
    code = events[-1]["fields"].get("returncode") if events else None
    return code if isinstance(code, int) and ctx.not_started(suite, code) else None


def _failed(ctx: CellContext, suite: str, what: str, exc: DriverError, suspects: list[str],
            message: str) -> Exception:
    """A spawned participant's DriverError: inconclusive when its command could not run at all, else a failure."""
    code = _not_started(ctx, suite, what)
    if code is not None:
        return Unavailable(suite, f"the {what} exited {code} (not startable): {exc}")
    return Broken(suspects, f"{message}: {exc}")


def _versions(ctx: CellContext, *suites: str) -> list[int]:
    common = set.intersection(*({v for v in ctx.part(s).versions if v in (1, 2)} for s in suites))
    return sorted(int(v) for v in common)


def _sequence(ctx: CellContext, geometry: Any, version: int, request_id: str, garbage_tail: bool) -> Any:
    rng = np.random.default_rng(ctx.seed)
    b = geometry.block_tokens
    tail = b // 2 + 1 if b > 1 else 0
    n_tokens = FULL_BLOCKS * b + tail
    tokens = [int(t) for t in rng.integers(0, 2**32, n_tokens)]
    n_blocks = FULL_BLOCKS + (1 if tail else 0)
    kv = make_kv(rng, geometry, n_blocks, garbage_tail=garbage_tail, last_fill=tail or None)
    path = write_sequence(ctx.dir / "sequence.json", geometry, version, tokens, request_id, kv)
    ctx.identifiers.update(request_id=request_id, sequence=path.name)
    ctx.exchanged["sequence"] = {"file": path.name, "geometry": geometry.as_dict(), "version": version,
                                 "tokens": n_tokens, "blocks": n_blocks}
    return path, tokens, kv


def run_transfer(ctx: CellContext) -> None:
    """prefill x decode (see the module docstring)."""

    pf, dec = "tlkv-prefill", "tlkv-decode"
    versions = _versions(ctx, pf, dec)
    geometry = Geometry.from_dict(dict(ctx.part(dec).pics.get("tlkv", {}).get("decode", {}).get(
        "geometry", DEFAULT_GEOMETRY)))
    request_id = f"kvconform-matrix-{ctx.id}-{ctx.seed:x}"
    seq_path, tokens, _ = _sequence(ctx, geometry, versions[-1], request_id, garbage_tail=False)
    hashes = chain_hashes(tokens, geometry.block_tokens)
    decode_versions = frozenset(int(v) for v in ctx.part(dec).versions if v in (1, 2))
    try:
        decode = driver_for(dec, ctx.spec(dec))
        address = decode.start(geometry, decode_versions)
    except TargetUnavailable as exc:
        raise Unavailable(dec, str(exc)) from exc
    try:
        ctx.identifiers["decode_addr"] = address
        ctx.step("decode side ready", address=address, geometry=str(geometry), versions=sorted(decode_versions))
        try:
            prefill = driver_for(pf, ctx.spec(pf))
        except TargetUnavailable as exc:
            raise Unavailable(pf, str(exc)) from exc
        ctx.step("prefill side started", decode_addr=address, sequence=seq_path.name, version=versions[-1])
        try:
            prefill.prefill(address, seq_path, PREFILL_TIMEOUT_S)
        except TargetUnavailable as exc:
            raise Unavailable(pf, str(exc)) from exc
        except DriverError as exc:
            raise _failed(ctx, pf, "prefill side", exc, [pf, dec], "the transfer did not complete") from exc
        ctx.step("prefill side done")
        never = (hashes[-1] ^ 0x9E3779B97F4A7C15) or 1
        asked = [*hashes, 0, never]
        with KvTransferClient(address, CALL_TIMEOUT_S) as client:
            outcome = client.has_blocks_call(asked)
        ctx.exchanged["has_blocks"] = {"asked": [f"{h:016x}" for h in asked], "status": outcome.status_name,
                                       "details": outcome.details, "held": outcome.held}
        ctx.step("HasBlocks asked by the harness", status=outcome.status_name, held=outcome.held)
        if outcome.held is None:
            raise Broken([dec], f"HasBlocks after the transfer ended {outcome.status_name}, expected OK: "
                                f"{outcome.details}")
        if len(outcome.held) != len(asked):
            raise Broken([dec], f"HasBlocks answered {len(outcome.held)} flags for {len(asked)} hashes, expected one "
                                "each")
        missing = [i for i, held in enumerate(outcome.held[:len(hashes)]) if not held]
        if missing:
            raise Broken([pf, dec], f"after the transfer the decode side does not hold full blocks {missing} of "
                                    f"{len(hashes)} (hashes {[f'{hashes[i]:016x}' for i in missing]}): HasBlocks "
                                    f"answered {outcome.held[:len(hashes)]}, expected all held")
        if outcome.held[len(hashes)]:
            raise Broken([dec], "HasBlocks answers held for hash 0, which names no block (the partial tail's)")
        if outcome.held[len(hashes) + 1]:
            raise Broken([dec], f"HasBlocks answers held for {never:016x}, a hash nobody sent")
        ctx.step("verified", held=len(hashes))
    finally:
        decode.stop()


def _expected_values(geometry: Any, version: int, tokens: list[int], kv: Any) -> list[Any]:
    """What a correct writer's envelope decodes to: the reference's encoding, read by the reference reader."""

    env = read_envelope(encode_sequence(geometry, version, tokens, kv), geometry=geometry, versions={version})
    return [np.asarray(env.kv(i), dtype=np.float64) for i in range(len(env.records))]


def run_envelope(ctx: CellContext) -> None:
    """writer x reader (see the module docstring)."""

    wr, rd = "tlkv-writer", "tlkv-reader"
    versions = _versions(ctx, wr, rd)
    reader_pics = ctx.part(rd).pics.get("tlkv", {}).get("reader", {})
    raw = ENVELOPE_GEOMETRY if reader_pics.get("any_geometry") else reader_pics.get("geometry", DEFAULT_GEOMETRY)
    geometry = Geometry.from_dict(dict(raw))
    version = versions[-1]
    _, tokens, kv = _sequence(ctx, geometry, version, f"kvconform-matrix-{ctx.id}-{ctx.seed:x}", garbage_tail=True)
    try:
        writer = driver_for(wr, ctx.spec(wr))
        ctx.step("writer started", geometry=str(geometry), version=version)
        envelope = writer.export(geometry, version, tokens, kv)
    except TargetUnavailable as exc:
        raise Unavailable(wr, str(exc)) from exc
    except DriverError as exc:
        raise _failed(ctx, wr, "writer", exc, [wr], "the writer failed") from exc
    (ctx.dir / "envelope.bin").write_bytes(envelope)
    ctx.exchanged["envelope"] = {"file": "envelope.bin", "octets": len(envelope)}
    ctx.step("envelope written", octets=len(envelope))
    try:
        session = driver_for(rd, ctx.spec(rd)).open(geometry, frozenset(int(v) for v in ctx.part(rd).versions
                                                                          if v in (1, 2)))
        outcome = session.import_envelope(envelope)
    except TargetUnavailable as exc:
        raise Unavailable(rd, str(exc)) from exc
    except DriverError as exc:
        raise _failed(ctx, rd, "reader", exc, [rd], "the reader failed") from exc
    got = [{"block_hash": f"{b.block_hash:016x}", "n_tokens": b.n_tokens} for b in outcome.blocks]
    ctx.exchanged["import"] = {"status": outcome.status, "requirement": outcome.requirement,
                               "message": outcome.message, "blocks": got}
    ctx.step("reader imported", status=outcome.status, blocks=len(outcome.blocks))
    if outcome.status != "ok":
        raise Broken([wr, rd], f"the reader refused the writer's envelope: {outcome.status} "
                               f"({outcome.requirement or 'no requirement named'}): {outcome.message}")
    b = geometry.block_tokens
    expected = [{"block_hash": f"{h:016x}", "n_tokens": n} for h, n in zip(block_hashes(tokens, b),
                                                                            block_fills(len(tokens), b), strict=True)]
    if got != expected:
        raise Broken([wr, rd], f"the reader imported blocks {got}, expected {expected} (hash and fill of each block)")
    if any(block.kv is None for block in outcome.blocks):
        raise Unobservable("the reader does not show the values it imported (no kv_file in its result): the "
                           "blocks' hashes and fills agree, their content cannot be compared")
    for i, (block, want) in enumerate(zip(outcome.blocks, _expected_values(geometry, version, tokens, kv),
                                          strict=True)):
        values = np.asarray(block.kv, dtype=np.float64)
        if values.shape != want.shape or not np.array_equal(values, want):
            where = np.argwhere(values != want)[0] if values.shape == want.shape else None
            raise Broken([wr, rd], f"block {i}: the imported values differ from what a v{version} envelope of the "
                                   f"sequence holds" + (f" (first at index {tuple(int(x) for x in where)}: got "
                                                        f"{values[tuple(where)]}, expected {want[tuple(where)]})"
                                                        if where is not None else f" (shape {values.shape}, "
                                                                                  f"expected {want.shape})"))
    ctx.step("verified", blocks=len(outcome.blocks))
