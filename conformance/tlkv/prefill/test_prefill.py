"""tlkv-prefill: what a prefill side sends to a decode side (TLKV "Transfer (tl.kv.v1)").

The harness is the decode side: the reference decode side on 127.0.0.1, instrumented to record every
HasBlocks and KvChunk (a stream it refuses is still read to its end, so one wrong chunk does not hide the
rest), pre-loaded with the scenario's held blocks.  Each scenario runs the prefill side once; the checks read
the recording, each judging one thing and blaming its rule: a block's chunk missing is blamed on the rule that
block's chunk follows (an empty payload when held, its payload otherwise), not on every check.  Scenarios hold
nothing, a prefix, a block in the middle (held blocks need not be a prefix), every full block of a sequence
without a tail, and use B = 1.  A prefill side that fails before sending anything fails its scenario once.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvconform import evidence, sweep
from kvconform.capture import hooks as capture
from kvconform.checksum import crc32c
from kvconform.conformance.tlkv.hashes import CHAIN, FULL_BLOCK_RULES, FULL_ONLY, ZERO_IS_ONE, judge_hashes
from kvconform.conformance.tlkv.judging import cites, held
from kvconform.conformance.tlkv.scenarios import case_seed, make_contents, make_tokens
from kvconform.fixtures.tlkv import CALL_TIMEOUT
from kvconform.targets.spec import Pics
from kvconform.targets.tlkv import Prefill
from kvconform.tlkv.blockhash import ZERO_HASH_TOKENS, block_fills, chain_hashes
from kvconform.tlkv.chunk import MAX_CHUNK_PAYLOAD, Chunk
from kvconform.tlkv.content import write_sequence
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_client import KvTransferClient
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.reader import EnvelopeError, read_envelope
from kvconform.verdicts import (
    DriverError,
    Findings,
    HarnessBug,
    TargetUnavailable,
    check,
    check_equal,
    inconclusive,
    violation,
)

# Seconds one transfer may take: a few blocks over loopback, plus an interpreter's start-up for a cmd: prefill
# side on a loaded machine; past it the prefill side hung.
PREFILL_TIMEOUT = 30.0


@dataclass(frozen=True)
class Scenario:
    name: str
    geometry: Geometry
    n_tokens: int
    held: frozenset[int]  # indices of full blocks the decode side holds before the transfer
    version: int
    first_tokens: tuple[int, ...] = ()  # fixed leading tokens; the rest are random


SCENARIOS = sweep.pick([
    Scenario("cold-tail", Geometry(16, 2, 2, 8), 3 * 16 + 5, frozenset(), 1),
    Scenario("prefix-held", Geometry(16, 2, 2, 8), 4 * 16 + 9, frozenset({0, 1}), 1),
    Scenario("middle-held", Geometry(16, 2, 2, 8), 4 * 16 + 1, frozenset({2}), 1),
    Scenario("all-held-no-tail", Geometry(16, 2, 2, 8), 3 * 16, frozenset({0, 1, 2}), 1),
    Scenario("v2-prefix-held", Geometry(16, 3, 1, 8), 3 * 16 + 15, frozenset({0}), 2),
    Scenario("b1-prefix-held", Geometry(1, 2, 2, 4), 5, frozenset({0, 1}), 1),
    # Block 0's fnv1a64 is 0: the decode side holds it under hash 1, the replacement.
    Scenario("zero-hash-held", Geometry(16, 2, 2, 4), 2 * 16 + 3, frozenset({0}), 1, ZERO_HASH_TOKENS),
], [
    # --sweep wide: two held blocks apart in v2 at odd B and D; the engine's geometry (2 MiB v1 chunks).
    Scenario("v2-gaps-held", Geometry(3, 2, 3, 5), 5 * 3 + 2, frozenset({1, 3}), 2),
    Scenario("engine-prefix-held", Geometry(16, 32, 8, 128), 2 * 16 + 1, frozenset({0}), 1),
])


@dataclass
class Recording:
    """What the instrumented decode side saw, in order."""

    scenario: Scenario
    tokens: list[int]
    kv: np.ndarray
    events: list[tuple[str, Any]] = field(default_factory=list)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, kind: str, *args: object) -> None:
        with self.lock:
            self.events.append((kind, args))

    @property
    def has_blocks(self) -> list[list[int]]:
        return [list(args[0].block_hashes) for kind, args in self.events if kind == "HasBlocks"]  # type: ignore[attr-defined]

    @property
    def chunks(self) -> list[Chunk]:
        return [args[0] for kind, args in self.events if kind == "KvChunk"]  # type: ignore[misc]

    @property
    def push_ends(self) -> list[str]:
        return [args[0].name for kind, args in self.events if kind == "PushKvEnd"]  # type: ignore[attr-defined]


def _preload(address: str, sc: Scenario, tokens: list[int], kv: np.ndarray) -> None:
    """Store the scenario's held blocks through our own client, before the prefill side runs."""
    hashes = chain_hashes(tokens, sc.geometry.block_tokens)
    rid = f"preload-{uuid.uuid4().hex[:8]}"
    chunks = [Chunk.for_payload(rid, i, hashes[i], sc.version,
                                encode_envelope(sc.geometry, sc.version,
                                                [Block(hashes[i], sc.geometry.block_tokens, kv[i])]))
              for i in sorted(sc.held)]
    if chunks:
        with KvTransferClient(address, CALL_TIMEOUT) as client:
            outcome = client.push(chunks)
        if not outcome.ok:
            raise HarnessBug(f"the harness's own decode side refused the preload: {outcome.status_name} "
                             f"{outcome.details}")


@pytest.fixture(scope="module")
def recording(request: pytest.FixtureRequest, tlkv_prefill: Prefill, pics: Pics,
              session_seed: int) -> Iterator[Recording]:
    sc: Scenario = request.param
    pics.require("tlkv.prefill.versions", sc.version)
    rng = np.random.default_rng(case_seed(session_seed, "prefill", sc.name))
    tokens = [*sc.first_tokens, *make_tokens(rng, sc.n_tokens - len(sc.first_tokens))]
    kv = make_contents(rng, sc.geometry, sc.n_tokens)
    rec = Recording(sc, tokens, kv)
    server = DecodeServer(DecodeSide(sc.geometry, frozenset({1, 2})), host="127.0.0.1", port=0,
                          observer=rec.observe, read_whole_stream=True)
    port = server.start()
    try:
        address = f"127.0.0.1:{port}"
        _preload(address, sc, tokens, kv)
        rec.events.clear()
        with tempfile.TemporaryDirectory(prefix="kvconform-prefill-") as tmp:
            seq = write_sequence(Path(tmp) / "sequence.json", sc.geometry, sc.version, tokens,
                                 f"kvconform-{uuid.uuid4().hex[:12]}", kv)
            try:
                with capture.tcp_endpoint(address) as dialled:  # a capture relay's address when one records
                    tlkv_prefill.prefill(dialled, seq, PREFILL_TIMEOUT)
            except TargetUnavailable:
                raise  # it could not be started: every check of the scenario is inconclusive, and gates
            except DriverError as exc:
                rec.error = str(exc)
            except Exception as exc:  # a python: prefill side's own error: the target failed, not kvconform
                rec.error = f"the prefill side raised {type(exc).__name__}: {exc}"
        if rec.error is not None and not rec.events:
            # It crashed or hung before sending anything: one failure for the scenario (its first check), the
            # other checks of the scenario inconclusive, instead of one failure per requirement.
            raise DriverError(f"the prefill side sent nothing to the decode side: {rec.error}")
        yield rec
    finally:
        server.stop(0)


@pytest.fixture(autouse=True)
def _evidence(recording: Recording) -> None:
    sc = recording.scenario
    evidence.record("note", "scenario", {"name": sc.name, "geometry": sc.geometry.as_dict(), "held": sorted(sc.held),
                                         "version": sc.version, "n_tokens": sc.n_tokens, "error": recording.error})
    for kind, args in recording.events:
        if kind == "KvChunk":
            c: Chunk = args[0]  # type: ignore[assignment]
            evidence.record("received", "KvChunk", {"block_index": c.block_index,
                                                    "block_hash": f"0x{c.block_hash:016X}",
                                                    "kv_format": c.kv_format, "payload_len": len(c.payload),
                                                    "crc32c": f"0x{c.crc32c:08X}"})
        elif kind == "HasBlocks":
            evidence.record("received", "HasBlocks", {"block_hashes": [f"0x{h:016X}" for h in args[0].block_hashes]})  # type: ignore[attr-defined]
        else:
            evidence.record("received", kind, {"args": [str(a) for a in args]})


def _expected_hashes(rec: Recording) -> list[int]:
    return chain_hashes(rec.tokens, rec.scenario.geometry.block_tokens)


def _n_full(sc: Scenario) -> int:
    return sc.n_tokens // sc.geometry.block_tokens


def _has_tail(sc: Scenario) -> bool:
    return sc.n_tokens % sc.geometry.block_tokens != 0


def _hash_reqs(sc: Scenario) -> list[str]:
    """The hash rules a scenario's contents exercise."""
    n_full = _n_full(sc)
    reqs = [r for r in FULL_BLOCK_RULES if n_full and (r != CHAIN or n_full > 1)]
    reqs += [ZERO_IS_ONE] if sc.first_tokens == ZERO_HASH_TOKENS else []
    return reqs + ([FULL_ONLY] if _has_tail(sc) else [])


def _unheld(sc: Scenario) -> bool:
    """Some block (a full one not held, or the tail) must go with its payload."""
    return len(sc.held) < _n_full(sc) or _has_tail(sc)


def _scenarios(reqs: Callable[[Scenario], list[str]]) -> pytest.MarkDecorator:
    """Parametrize `recording` over the scenarios, each with the rules its contents exercise."""
    return pytest.mark.parametrize("recording", [pytest.param(sc, id=sc.name, marks=pytest.mark.req(*reqs(sc)))
                                                 for sc in SCENARIOS], indirect=True)


def _fx(values: list[int]) -> list[str]:
    return [f"0x{h:016X}" for h in values]


@_scenarios(lambda sc: ["TLKV-XFER-HASBLOCKS-FIRST", *_hash_reqs(sc)])
def test_has_blocks_first(recording: Recording) -> None:
    error = f" ({recording.error})" if recording.error else ""
    check(recording.events, f"calls the prefill side made{error}", req="TLKV-XFER-HASBLOCKS-FIRST", seen="none",
          expected="HasBlocks, then PushKv")
    first = recording.events[0][0]
    check_equal("the prefill side's first call", first, "HasBlocks", req="TLKV-XFER-HASBLOCKS-FIRST")
    sc = recording.scenario
    want = _expected_hashes(recording)
    got = recording.has_blocks[0]
    if len(got) == len(want) + 1 and _has_tail(sc):
        violation("HasBlocks block_hashes: one hash more than the prompt's full blocks: the partial tail was asked "
                  "about", req="TLKV-HASH-FULL-ONLY", seen=_fx(got), expected=_fx(want))
    check(len(got) == len(want), "HasBlocks block_hashes: the prompt's full-block hashes",
          req="TLKV-XFER-HASBLOCKS-FIRST", seen=_fx(got), expected=_fx(want))
    held("TLKV-HASH-FULL-ONLY", "no hash asked for the partial tail")
    findings = Findings("HasBlocks block_hashes")
    judge_hashes(findings, "HasBlocks block_hashes[{i}]", got, recording.tokens, sc.geometry.block_tokens, len(got))
    findings.judge()


@_scenarios(lambda sc: ["TLKV-XFER-CHUNK-FIELDS", *_hash_reqs(sc)])
def test_one_chunk_per_block_in_order(recording: Recording) -> None:
    sc = recording.scenario
    chunks = recording.chunks
    if not chunks:
        inconclusive("the prefill side sent no chunk (the per-block check judges that)")
    n_blocks = len(block_fills(sc.n_tokens, sc.geometry.block_tokens))
    indices = [c.block_index for c in chunks]
    check(indices == sorted(set(indices)) and all(0 <= i < n_blocks for i in indices),
          "KvChunk.block_index of the chunks, in the order sent: each block's position, once, in order",
          req="TLKV-XFER-CHUNK-FIELDS", seen=indices, expected=f"increasing, within 0..{n_blocks - 1}")
    requests = sorted({c.request_id for c in chunks})
    check(len(requests) == 1, "KvChunk.request_id: one per PushKv stream", req="TLKV-XFER-CHUNK-FIELDS",
          seen=requests, expected="one request_id")
    findings = Findings("KvChunk.block_hash")
    by_index = {c.block_index: c.block_hash for c in chunks}
    present = sorted(by_index)
    if present == list(range(len(present))):  # a prefix of the blocks: judge their hashes as a chain
        judge_hashes(findings, "KvChunk[{i}]", [by_index[i] for i in present], recording.tokens,
                     sc.geometry.block_tokens, len(present))
    else:
        want = _expected_hashes(recording) + [0] * (n_blocks - len(_expected_hashes(recording)))
        for i in present:
            findings.expect(by_index[i] == want[i], CHAIN if cites(CHAIN) else "TLKV-XFER-CHUNK-FIELDS",
                            f"KvChunk[{i}].block_hash: got 0x{by_index[i]:016X}, expected 0x{want[i]:016X}")
    findings.judge()


def _per_block_reqs(sc: Scenario) -> list[str]:
    return (["TLKV-XFER-EMPTY-HELD"] if sc.held else []) + (["TLKV-XFER-PAYLOAD-MISSING"] if _unheld(sc) else [])


@_scenarios(_per_block_reqs)
def test_empty_payload_exactly_for_held(recording: Recording) -> None:
    sc = recording.scenario
    n_blocks = len(block_fills(sc.n_tokens, sc.geometry.block_tokens))
    sent = {c.block_index: c for c in recording.chunks}
    for i in range(n_blocks):
        c = sent.get(i)
        if i in sc.held:
            check(c is not None and c.payload == b"", f"the chunk of block {i}, which the decode side holds: the "
                  "chunk with an empty payload", req="TLKV-XFER-EMPTY-HELD",
                  seen="no chunk" if c is None else f"{len(c.payload)} payload bytes", expected="an empty payload")
        else:
            kind = "the partial tail" if i >= _n_full(sc) else "a block the decode side does not hold"
            check(c is not None and c.payload != b"", f"the chunk of block {i}, {kind}: its payload",
                  req="TLKV-XFER-PAYLOAD-MISSING", seen="no chunk" if c is None else "an empty payload",
                  expected="its envelope")


def _payload_reqs(sc: Scenario) -> list[str]:
    reqs = ["TLKV-XFER-FORMAT", "TLKV-XFER-CRC"]
    return reqs + (["TLKV-XFER-ONE-BLOCK", "TLKV-XFER-MAX-PAYLOAD", "TLKV-XFER-PAYLOAD-MISSING"] if _unheld(sc)
                   else [])


@_scenarios(_payload_reqs)
def test_payloads(recording: Recording) -> None:
    sc = recording.scenario
    fills = block_fills(sc.n_tokens, sc.geometry.block_tokens)
    if not recording.chunks:
        inconclusive("the prefill side sent no chunk (the per-block check judges that)")
    for c in recording.chunks:
        where = f"chunk {c.block_index}"
        check_equal(f"{where}: kv_format (its payload's envelope version)", c.kv_format, sc.version,
                    req="TLKV-XFER-FORMAT")
        check(c.crc32c == crc32c(c.payload), f"{where}: crc32c, the CRC-32C of the {len(c.payload)} payload bytes",
              req="TLKV-XFER-CRC", seen=f"0x{c.crc32c:08X}", expected=f"0x{crc32c(c.payload):08X}")
        if not c.payload:
            continue
        check(len(c.payload) <= MAX_CHUNK_PAYLOAD, f"{where}: payload size", req="TLKV-XFER-MAX-PAYLOAD",
              seen=len(c.payload), expected=f"at most {MAX_CHUNK_PAYLOAD}")
        try:
            env = read_envelope(c.payload, geometry=sc.geometry, versions={sc.version})
        except EnvelopeError as exc:
            violation(f"{where}: the payload is not a whole envelope of the sequence's geometry: {exc}",
                      req="TLKV-XFER-ONE-BLOCK")
        check_equal(f"{where}: the envelope's n_blocks", len(env.records), 1, req="TLKV-XFER-ONE-BLOCK")
        if not 0 <= c.block_index < len(fills):
            continue  # not a block of the sequence: the chunk-fields check blames that
        check_equal(f"{where}: the envelope record's n_tokens (the block's fill)", env.records[0].n_tokens,
                    fills[c.block_index], req="TLKV-XFER-PAYLOAD-MISSING")
        if sc.version == 1:
            want = encode_envelope(sc.geometry, 1, [Block(c.block_hash, fills[c.block_index],
                                                          recording.kv[c.block_index])])
            check(c.payload == want, f"{where}: the payload, the block's v1 envelope (a pure function of its "
                  "contents)", req="TLKV-XFER-PAYLOAD-MISSING", seen=c.payload, expected=want)


def _bytes_reqs(sc: Scenario) -> list[str]:
    return ["TLKV-XFER-BYTES", *_per_block_reqs(sc)]


@_scenarios(_bytes_reqs)
def test_bytes_moved(recording: Recording) -> None:
    """(missing full blocks + 1 tail) * envelope size follows from sending an empty payload exactly for the held
    blocks: a wrong total is blamed on the block whose payload went or did not, else on the total itself."""
    sc = recording.scenario
    size = sc.geometry.envelope_size(1, sc.version)
    missing = _n_full(sc) - len(sc.held)
    tail = 1 if _has_tail(sc) else 0
    want = (missing + tail) * size
    got = sum(len(c.payload) for c in recording.chunks)
    if got != want:
        sent = {c.block_index: c for c in recording.chunks}
        n_blocks = _n_full(sc) + tail
        for i in range(n_blocks):
            c = sent.get(i)
            if i in sc.held:
                check(c is None or not c.payload, f"payload bytes moved: {got}, expected {want}; block {i} is held, "
                      "and its payload was sent", req="TLKV-XFER-EMPTY-HELD", seen=len(c.payload) if c else 0,
                      expected=0)
            else:
                check(c is not None and c.payload, f"payload bytes moved: {got}, expected {want}; block {i} went "
                      "without its payload", req="TLKV-XFER-PAYLOAD-MISSING", seen=0, expected=size)
    check_equal(f"payload bytes moved: (missing {missing} + tail {tail}) * envelope {size}", got, want,
                req="TLKV-XFER-BYTES")
