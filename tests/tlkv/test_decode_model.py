"""The decode side against a model, driven by hypothesis through random interleavings of streams
(STYLE.md: h11's state machines walked cell by cell).

Several PushKv streams are open at once; chunks (a payload, an empty payload, a corrupt CRC) arrive on
any of them in any order; streams finish or fail; finished requests are released. The model: a block is
held iff some committed request still references it; a failed stream changes nothing (TLKV-XFER-ATOMIC);
an empty payload is served iff the block is held or stored earlier in the same stream (TLKV-XFER-EMPTY-HELD).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from kvconform.tlkv.chunk import Chunk
from kvconform.tlkv.decode import DecodeSide, PushStream, Status, TransferError
from kvconform.tlkv.envelope import Block, encode_envelope
from kvconform.tlkv.geometry import Geometry

GEOMETRY = Geometry(2, 1, 1, 2)
HASHES = list(range(1, 7))
PAYLOADS = {h: encode_envelope(GEOMETRY, 1, [Block(h, 2, np.full(GEOMETRY.kv_shape, h, np.float16))])
            for h in HASHES}


@dataclass
class OpenStream:
    rid: str
    stream: PushStream
    stores: set[int] = field(default_factory=set)
    uses: Counter[int] = field(default_factory=Counter)  # references the stream would take on commit


class DecodeModel(RuleBasedStateMachine):
    streams = Bundle("streams")
    finished = Bundle("finished")

    def __init__(self) -> None:
        super().__init__()
        self.side = DecodeSide(GEOMETRY, frozenset({1}))
        self.refs: dict[str, Counter[int]] = {}  # committed request -> references per hash
        self.count = 0

    def held(self) -> set[int]:
        total: Counter[int] = Counter()
        for refs in self.refs.values():
            total.update(refs)
        return {h for h, n in total.items() if n > 0}

    @rule(target=streams)
    def begin(self) -> OpenStream:
        self.count += 1
        return OpenStream(f"r{self.count}", self.side.begin_push())

    @rule(s=streams, h=st.sampled_from(HASHES))
    def payload(self, s: OpenStream, h: int) -> None:
        if s.stream.state != "open":
            return
        s.stream.receive(Chunk.for_payload(s.rid, 0, h, 1, PAYLOADS[h]))
        s.stores.add(h)
        s.uses[h] += 1

    @rule(s=streams, h=st.sampled_from(HASHES))
    def empty(self, s: OpenStream, h: int) -> None:
        if s.stream.state != "open":
            return
        servable = h in self.held() or h in s.stores
        try:
            s.stream.receive(Chunk.for_payload(s.rid, 0, h, 1, b""))
        except TransferError as exc:
            assert not servable, f"empty payload for 0x{h:X} refused although servable: {exc}"
            assert exc.status is Status.NOT_FOUND
            assert s.stream.state == "failed"
            return
        assert servable, f"empty payload for 0x{h:X} accepted although neither held nor stored in the stream"
        s.uses[h] += 1

    @rule(s=streams, h=st.sampled_from(HASHES))
    def corrupt(self, s: OpenStream, h: int) -> None:
        if s.stream.state != "open":
            return
        good = Chunk.for_payload(s.rid, 0, h, 1, PAYLOADS[h])
        try:
            s.stream.receive(Chunk(s.rid, 0, h, 1, good.payload, good.crc32c ^ 1))
        except TransferError as exc:
            assert exc.status is Status.DATA_LOSS
        else:
            raise AssertionError("a chunk with a wrong crc32c was accepted")
        assert s.stream.state == "failed"

    @rule(target=finished, s=consumes(streams))
    def finish(self, s: OpenStream) -> str:
        if s.stream.state != "open":
            return ""
        # A reference staged on a block another request released meanwhile makes the commit fail whole.
        conflict = any(h not in s.stores and h not in self.held() for h in s.uses)
        try:
            s.stream.finish()
        except TransferError as exc:
            assert conflict, f"finish failed without a conflict: {exc}"
            return ""
        assert not conflict, "finish committed a reference to a block that is no longer held"
        self.refs[s.rid] = Counter(s.uses)
        return s.rid

    @rule(s=consumes(streams))
    def fail(self, s: OpenStream) -> None:
        s.stream.fail()

    @rule(rid=consumes(finished))
    def release(self, rid: str) -> None:
        if rid:
            self.side.release(rid)
            self.refs.pop(rid, None)

    @invariant()
    def held_blocks_match(self) -> None:
        want = self.held()
        got = self.side.has_blocks([*HASHES, 0])
        assert got == [*(h in want for h in HASHES), False], f"held {got}, model {sorted(want)}"


DecodeModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_decode_side_matches_the_model = DecodeModel.TestCase
