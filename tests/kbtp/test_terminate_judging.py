"""How the iWARP wire checks read a Terminate (conformance/kbtp/terminate.py): a nibble-swapped octet 0 with the
expected Code is the expected error only where the octet as read names no error, and the header rule
(KBTP-WIRE-TERMINATE-HEADER) lists what breaks the layout, siw's little-endian bitfields included."""

from __future__ import annotations

from kvconform.conformance.kbtp.terminate import Named, layout_faults, names
from kvconform.rdma import Layer, Terminate
from kvconform.rdma.iwarp.rdmap import decode_terminate, encode_terminate
from tests.mutants.kbtp_wire_attacks import _le_bitfields

DDP_HEADER = bytes([0x41, 0x43]) + bytes(16)  # an untagged Send's 18-octet DDP header


def _read(octets: bytes) -> Terminate:
    return decode_terminate(octets, "target").terminate


def test_the_wire_octets_are_kept_and_do_not_change_equality() -> None:
    raw = encode_terminate(Terminate(Layer.DDP, 2, 3, "x"), DDP_HEADER)
    term = _read(raw)
    assert term.wire == raw and term.key() == (1, 2, 3)
    assert term == Terminate(Layer.DDP, 2, 3, term.reason, "target")


def test_a_swap_is_the_expected_error_only_where_the_octet_read_names_none() -> None:
    msn = encode_terminate(Terminate(Layer.DDP, 2, 3, "x"), DDP_HEADER)
    assert names(_read(msn), {1}, {2}, {2, 3}) is Named.EXACT
    assert names(_read(_le_bitfields(msn)), {1}, {2}, {2, 3}) is Named.SWAPPED  # (2, 1, 3): LLP has only EType 0
    bounds = _le_bitfields(encode_terminate(Terminate(Layer.RDMAP, 1, 1, "x")))
    assert names(_read(bounds), {0}, {1}, {1}) is Named.SWAPPED  # (1, 0, 1): local catastrophic has only Code 0
    crc = _le_bitfields(encode_terminate(Terminate(Layer.LLP, 0, 2, "x")))
    assert names(_read(crc), {2}, {0}, {2}) is Named.SWAPPED  # (0, 2, 2): Remote Operation has no Code 2
    # ambiguous: (2, 0, 1) is an LLP error of its own (TCP connection lost), never read as RDMAP (0, 2, 1) swapped
    assert names(_read(bytes([0x20, 0x01, 0, 0])), {0}, {2}, {1}) is Named.OTHER
    assert names(_read(bytes([0x21, 0x04, 0, 0])), {1}, {2}, {2, 3}) is Named.OTHER  # the wrong Code


def test_the_header_rule_names_what_breaks_the_layout() -> None:
    right = _read(encode_terminate(Terminate(Layer.DDP, 2, 3, "x"), DDP_HEADER))
    assert layout_faults(right, 0x12, terminated_ddp=18) == []
    siw = _read(_le_bitfields(encode_terminate(Terminate(Layer.DDP, 2, 3, "x"), DDP_HEADER)))
    faults = layout_faults(siw, 0x12, terminated_ddp=18)
    assert len(faults) == 3 and "octet 0 read 0x21" in faults[0] and "Reserved bits hold 0x0200" in faults[1]
    assert "carries 24 octets" in faults[2]
    with_r = _read(bytes([0x12, 0x03, 0x20, 0x00]))
    assert any("HdrCt R is set" in f for f in layout_faults(with_r, 0x12, terminated_ddp=18))
