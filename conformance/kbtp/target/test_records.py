"""kbtp-target: completion records (KBTP "Completion", "InfiniBand and RoCEv2"): written only where the
binding orders an RDMA Write after earlier Writes' data, as a 24-octet record by RDMA Write with
Immediate on InfiniBand/RoCEv2, never when RECORD_COMPLETION was not granted."""

from __future__ import annotations

import struct

import pytest

from kvconform.conformance.kbtp import expect
from kvconform.fixtures.kbtp import TargetUnderTest
from kvconform.kbtp.constants import Features, RequestFlags, Status
from kvconform.kbtp.messages import CompletionDescriptor, Load
from kvconform.rdma import Access, Binding, Op, Region
from kvconform.targets.kbtp_client import Gen, HarnessInitiator, Reply
from kvconform.verdicts import Violation, check, not_applicable

RC = Features.RECORD_COMPLETION


@pytest.mark.req("KBTP-COMP-RECORD-BINDING", "KBTP-COMP-SEND", "KBTP-HELLO-FIRST")
def test_record_flag_without_the_feature(kbtp_target: TargetUnderTest, seed: int) -> None:
    """RECORD on a session without RECORD_COMPLETION: the request completes by a COMPLETION message and
    the completion record slot stays untouched."""
    bed = kbtp_target.bed(seed, label="record-not-granted")
    a = bed.initiator("A")

    def scenario() -> Gen:
        ack = yield from bed.open(a)
        check(not ack.features & RC, "RECORD_COMPLETION granted without being requested",
              req="KBTP-COMP-RECORD-BINDING", seen=Features(ack.features))
        slot = a.buffer(24, Access.REMOTE_WRITE)
        slot.write(0, b"\x5a" * 24)
        msg = a.alloc_store_msg(a.handle(0), b"rec?", request_id=11, completion=CompletionDescriptor(slot.stag,
                                                                                                    slot.to(0)))
        a.send(a.enc(msg))
        got = yield from a.receive_any(req="KBTP-COMP-SEND", what="completion of the ALLOC_STORE with RECORD")
        check(isinstance(got, Reply), "a completion record was written although RECORD_COMPLETION was not granted",
              req="KBTP-COMP-RECORD-BINDING", seen=type(got).__name__, expected="a COMPLETION message")
        expect.equal("COMPLETION Request ID", got.request_id, 11, req="KBTP-COMP-SEND", offset=4)
        expect.equal("record slot contents", slot.read(0, 24), b"\x5a" * 24, req="KBTP-COMP-RECORD-BINDING")

    bed.run_one(scenario())


def _record(a: HarnessInitiator, area: Region, what: str) -> Gen:
    """The next completion; when none comes, a record written without Immediate (the area changed, nothing in
    the completion queue) fails KBTP-IB-RECORD-IMM, no record at all KBTP-COMP-RECORD."""
    before = area.read(0, area.length)
    try:
        got = yield from a.receive_any(req="KBTP-COMP-RECORD", what=what)
    except Violation:
        check(area.read(0, area.length) == before, f"{what}: a record was written, but no RDMA Write with "
              "Immediate told the initiator", req="KBTP-IB-RECORD-IMM")
        raise
    return got


@pytest.mark.req("KBTP-COMP-RECORD", "KBTP-IB-RECORD-IMM", "KBTP-DESC-COMPLETION", "KBTP-FLAG-RECORD",
                 "KBTP-HELLO-FIRST", "KBTP-LOAD-COMPLETE")
def test_completion_records(kbtp_target: TargetUnderTest, seed: int) -> None:
    """With RECORD_COMPLETION granted (an InfiniBand/RoCEv2 binding), ALLOC_STORE and LOAD with RECORD
    complete by a 24-octet record (Request ID, Status, Generation, Data Length, Block Offset) written by
    RDMA Write with Immediate into exactly the Completion Descriptor's slot, and no COMPLETION message;
    a request without RECORD on the same session still completes by a COMPLETION message."""
    kbtp_target.require(RC)
    if kbtp_target.params.profile.binding is Binding.RDMAP:
        not_applicable("PICS declares the RDMAP binding, where RECORD_COMPLETION is never offered")
    bed = kbtp_target.bed(seed, label="records")
    a = bed.initiator("A")
    data = b"recorded" * 3

    def scenario() -> Gen:
        ack = yield from bed.open(a, RC)
        check(bool(ack.features & RC), "HELLO_ACK lacks RECORD_COMPLETION, which PICS declares",
              req="KBTP-COMP-RECORD", seen=Features(ack.features))
        area = a.buffer(64, Access.REMOTE_WRITE)
        area.write(0, b"\xa5" * 64)
        cd = CompletionDescriptor(area.stag, area.to(16))  # the slot is octets 16-39 of the area
        h = a.handle(0)
        a.send(a.enc(a.alloc_store_msg(h, data, request_id=21, completion=cd)))
        wc = yield from _record(a, area, "completion record of ALLOC_STORE 21")
        check(not isinstance(wc, Reply), "ALLOC_STORE with RECORD completed by a COMPLETION message, not a record",
              req="KBTP-COMP-RECORD", seen="COMPLETION", expected="a completion record")
        check(wc.op is Op.RECV_RDMA_WITH_IMM, "the completion record did not arrive by RDMA Write with Immediate",
              req="KBTP-IB-RECORD-IMM", seen=wc.op.name, expected="RECV_RDMA_WITH_IMM")
        expect.equal("octets around the 24-octet record slot", area.read(0, 16) + area.read(40, 24), b"\xa5" * 40,
                     req="KBTP-DESC-COMPLETION")
        rid, status, gen, length, offset = struct.unpack(">QHHIQ", area.read(16, 24))
        expect.equal("record Request ID", rid, 21, req="KBTP-COMP-RECORD", offset=0)
        expect.equal("record Status", status, Status.OK, req="KBTP-COMP-RECORD", offset=8)
        check(gen != 0, "record Generation is 0", req="KBTP-COMP-RECORD", seen=gen)
        expect.equal("record Data Length", length, len(data), req="KBTP-COMP-RECORD", offset=12)
        dst = a.buffer(64, Access.REMOTE_WRITE)
        a.send(a.enc(Load(request_id=22, handle=h, flags=RequestFlags.RECORD, data=a.descriptor(dst, 64),
                          completion=cd)))
        wc = yield from _record(a, area, "completion record of LOAD 22")
        check(not isinstance(wc, Reply), "LOAD with RECORD completed by a COMPLETION message, not a record",
              req="KBTP-COMP-RECORD", seen="COMPLETION", expected="a completion record")
        expect.equal("LOAD record (Request ID, Status, Generation, Data Length, Block Offset)",
                     struct.unpack(">QHHIQ", area.read(16, 24)), (22, 0, gen, len(data), offset),
                     req="KBTP-COMP-RECORD")
        expect.equal("loaded data when the record arrived", dst.read(0, len(data)), data, req="KBTP-COMP-RECORD")
        lr, _ = yield from a.load(h, 64)
        check(isinstance(lr, Reply), "a LOAD without RECORD did not complete by a COMPLETION message",
              req="KBTP-FLAG-RECORD")
        expect.status_is(lr, Status.OK, req="KBTP-FLAG-RECORD", what="LOAD without RECORD")

    bed.run_one(scenario())
