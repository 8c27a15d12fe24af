"""kbtp-target: completion records (KBTP "Completion", "InfiniBand and RoCEv2"): written only where the
binding orders an RDMA Write after earlier Writes' data, as a 24-octet record by RDMA Write with
Immediate on InfiniBand/RoCEv2, never when RECORD_COMPLETION was not granted."""

from __future__ import annotations

import struct

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.conformance.kbtp.client import Gen, Reply
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, RequestFlags, Status
from kvconform.kbtp.messages import AllocStore, CompletionDescriptor, Load
from kvconform.rdma import Access, Binding, Op
from kvconform.verdicts import not_applicable

RC = Features.RECORD_COMPLETION


@pytest.mark.req("KBTP-COMP-RECORD-BINDING", "KBTP-FLAG-RECORD", "KBTP-COMP-SEND")
def test_record_flag_without_the_feature(kbtp_target: TargetUnderTest, seed: int) -> None:
    """RECORD on a session without RECORD_COMPLETION: the request completes by a COMPLETION message and
    the completion record slot stays untouched."""
    bed = kbtp_target.bed(seed, label="record-not-granted")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from a.hello(Features(0))
        expect.holds(not ack.features & RC, "RECORD_COMPLETION granted without being requested",
                     req="KBTP-COMP-RECORD-BINDING")
        assert a.session is not None
        slot = a.buffer(24, Access.REMOTE_WRITE)
        slot.write(0, b"\x5a" * 24)
        msg = AllocStore.with_inline(b"rec?", flags=RequestFlags.SEAL | RequestFlags.RECORD, request_id=11,
                                     handle=a.session.handle(0), completion=CompletionDescriptor(slot.stag, slot.to(0)))
        a.send(a.enc(msg))
        got = yield from a.receive_any()
        expect.holds(isinstance(got, Reply), "a completion record was written although RECORD_COMPLETION was not "
                     "granted", req="KBTP-COMP-RECORD-BINDING")
        assert isinstance(got, Reply)
        expect.equal("COMPLETION Request ID", got.message.request_id, 11, req="KBTP-COMP-SEND")
        expect.equal("record slot contents", slot.read(0, 24), b"\x5a" * 24, req="KBTP-COMP-RECORD-BINDING")

    bed.run_one(scenario())


@pytest.mark.req("KBTP-COMP-RECORD", "KBTP-IB-RECORD-IMM", "KBTP-DESC-COMPLETION", "KBTP-FLAG-RECORD")
def test_completion_records(kbtp_target: TargetUnderTest, seed: int) -> None:
    """With RECORD_COMPLETION granted (an InfiniBand/RoCEv2 binding), ALLOC_STORE and LOAD with RECORD
    complete by a 24-octet record (Request ID, Status, Generation, Data Length, Block Offset) written by
    RDMA Write with Immediate, and no COMPLETION message."""
    kbtp_target.require(RC)
    if kbtp_target.params.profile.binding is Binding.RDMAP:
        not_applicable("PICS declares the RDMAP binding, where RECORD_COMPLETION is never offered")
    bed = kbtp_target.bed(seed, label="records")
    a = bed.initiator("A")
    data = b"recorded" * 3

    def scenario() -> Gen:
        ack = yield from a.hello(RC)
        expect.holds(bool(ack.features & RC), "HELLO_ACK lacks RECORD_COMPLETION, which PICS declares",
                     req="KBTP-COMP-RECORD")
        assert a.session is not None
        slot = a.buffer(24, Access.REMOTE_WRITE)
        cd = CompletionDescriptor(slot.stag, slot.to(0))
        h = a.session.handle(0)
        a.send(a.enc(AllocStore.with_inline(data, flags=RequestFlags.SEAL | RequestFlags.RECORD, request_id=21,
                                            handle=h, completion=cd)))
        wc = yield from a.receive_any()
        expect.holds(not isinstance(wc, Reply) and wc.op is Op.RECV_RDMA_WITH_IMM,
                     f"ALLOC_STORE with RECORD completed by {type(wc).__name__}, not RDMA Write with Immediate",
                     req="KBTP-IB-RECORD-IMM")
        rid, status, gen, length, offset = struct.unpack(">QHHIQ", slot.read(0, 24))
        expect.equal("record Request ID", rid, 21, req="KBTP-COMP-RECORD")
        expect.equal("record Status", status, Status.OK, req="KBTP-COMP-RECORD")
        expect.holds(gen != 0, "record Generation is 0", req="KBTP-COMP-RECORD")
        expect.equal("record Data Length", length, len(data), req="KBTP-COMP-RECORD")
        dst = a.buffer(64, Access.REMOTE_WRITE)
        a.send(a.enc(Load(request_id=22, handle=h, flags=RequestFlags.RECORD, data=a.descriptor(dst, 64),
                          completion=cd)))
        wc = yield from a.receive_any()
        expect.holds(not isinstance(wc, Reply), "LOAD with RECORD completed by a COMPLETION message",
                     req="KBTP-IB-RECORD-IMM")
        rid2, status2, gen2, length2, offset2 = struct.unpack(">QHHIQ", slot.read(0, 24))
        expect.equal("LOAD record (Request ID, Status, Generation, Data Length, Block Offset)",
                     (rid2, status2, gen2, length2, offset2), (22, 0, gen, len(data), offset), req="KBTP-COMP-RECORD")
        expect.equal("loaded data when the record arrived", dst.read(0, len(data)), data, req="KBTP-COMP-RECORD")

    bed.run_one(scenario())
