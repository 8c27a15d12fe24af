"""conformance/kbtp/exposure.py: which spans a request describes, and which octet each probe reads (the probes
themselves run over both wires in tests/kbtp/test_served_mutants.py and test_wire_suites.py)."""

from __future__ import annotations

from kvconform.conformance.kbtp.exposure import AFTER_SESSION, SPAN_ENDS, Probe, spans_of
from kvconform.kbtp.constants import RequestFlags
from kvconform.kbtp.messages import AllocStore, CompletionDescriptor, DataDescriptor, Free, Load


def test_spans_are_the_named_buffers_and_record_slots() -> None:
    load = Load(request_id=1, handle=0x4000, flags=RequestFlags.RECORD, data=DataDescriptor(0x10, 0x2000, 1024),
                completion=CompletionDescriptor(0x20, 0x900))
    assert spans_of(load) == [("Load data", 0x10, 0x2000, 1024), ("Load completion record", 0x20, 0x900, 24)]
    inline = AllocStore(request_id=2, handle=0x4000, flags=RequestFlags.INLINE, data=DataDescriptor(0, 0, 5),
                        inline=b"first")
    assert spans_of(inline) == []  # inline data names no buffer
    assert spans_of(Free(request_id=3, handle=0x4000)) == [] and spans_of(None) == []


def test_each_probe_reads_one_octet_outside_the_span_or_its_start() -> None:
    span = ("Load data", 0x10, 0x2000, 1024)
    octets = {}
    for end in (*SPAN_ENDS, AFTER_SESSION):
        p = Probe(0, end)
        p.span = span
        octets[end] = p.octet()
    assert octets == {"before": 0x1FFF, "past": 0x2400, "after the session": 0x2000}
    zero_based = Probe(0, "before")
    zero_based.span = ("Load data", 0x10, 0, 1024)
    assert zero_based.octet() is None  # nothing before offset 0: that end is not probed
