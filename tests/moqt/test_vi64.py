"""vi64 (profile §2): the EDR vectors, the profile's values, non-minimal decoding, round-trips and the
Reader's errors (field + offset; NeedMoreData only on an open stream)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.moqt.errors import MoqtDecodeError, MoqtEncodeError, NeedMoreData, SessionError
from kvconform.moqt.vi64 import MAX_VI64, Reader, decode_vi64, encode_vi64, vi64_size

EDR_VECTORS = [
    ("25", 37),
    ("8025", 37),
    ("bbbd", 15293),
    ("ed7f3e7d", 226442877),
    ("faa1a0e403d8", 2893212287960),
    ("fc8998abc66bc0", 151288809941952),
    ("fefa318fa8e3ca11", 70423237261249041),
    ("ff" * 9, MAX_VI64),
]

PROFILE_VALUES = [
    (0x2F00, "af00"),
    (0x50, "50"),
    (0x80, "8080"),
    (0x8C, "808c"),
    (0x10C, "810c"),
    (0x20C, "820c"),
    (0x132B3E28, "f0132b3e28"),
    (3_600_000, "e036ee80"),
]


@pytest.mark.parametrize(("hexstr", "value"), EDR_VECTORS)
def test_edr_vectors_decode(hexstr: str, value: int) -> None:
    data = bytes.fromhex(hexstr)
    assert decode_vi64(data) == (value, len(data))


@pytest.mark.parametrize(("value", "hexstr"), PROFILE_VALUES)
def test_profile_values_encode_minimal(value: int, hexstr: str) -> None:
    assert encode_vi64(value).hex() == hexstr
    assert decode_vi64(bytes.fromhex(hexstr)) == (value, len(hexstr) // 2)


def test_not_the_rfc9000_varint() -> None:
    # RFC 9000 would write 0x50 as 40 50 and read 0x40 as a 2-byte prefix.
    assert encode_vi64(0x50) == b"\x50"
    assert decode_vi64(b"\x7f") == (127, 1)
    assert encode_vi64(128) == b"\x80\x80"


@pytest.mark.parametrize("hexstr", ["00", "8000", "c00000", "e0000000", "ff" + "00" * 8])
def test_non_minimal_zero_is_legal(hexstr: str) -> None:
    assert decode_vi64(bytes.fromhex(hexstr))[0] == 0


@pytest.mark.parametrize("size", range(1, 10))
def test_size_boundaries(size: int) -> None:
    top = MAX_VI64 if size == 9 else (1 << (7 * size)) - 1
    assert vi64_size(top) == size
    assert len(encode_vi64(top)) == size
    if size < 9:
        assert vi64_size(top + 1) == size + 1


@settings(max_examples=300, deadline=None)
@given(st.integers(0, MAX_VI64), st.integers(0, 8))
def test_round_trip_minimal_and_padded(value: int, pad: int) -> None:
    n = vi64_size(value)
    size = min(9, n + pad)
    for data in (encode_vi64(value), encode_vi64(value, size)):
        assert decode_vi64(data + b"\xaa") == (value, len(data))
    assert len(encode_vi64(value, size)) == size


@pytest.mark.parametrize("bad", [-1, MAX_VI64 + 1])
def test_encode_refuses_out_of_range(bad: int) -> None:
    with pytest.raises(MoqtEncodeError, match="outside"):
        encode_vi64(bad)


def test_encode_refuses_too_small_size() -> None:
    with pytest.raises(MoqtEncodeError, match="does not fit in 1 bytes"):
        encode_vi64(128, 1)


def test_truncated_vi64_names_field_and_offset() -> None:
    with pytest.raises(NeedMoreData) as info:
        decode_vi64(b"\x00\xc0\x01", 1, "Group ID")
    assert info.value.field == "Group ID"
    assert info.value.offset == 1


def test_final_reader_reports_overrun_as_protocol_violation() -> None:
    r = Reader(b"\x05\xc0\x01\x02\x03", 1, 3, context="SUBSCRIBE.")
    with pytest.raises(MoqtDecodeError) as info:
        r.vi64("Request ID")
    assert not isinstance(info.value, NeedMoreData)
    assert info.value.field == "SUBSCRIBE.Request ID"
    assert info.value.offset == 1
    assert info.value.code == SessionError.PROTOCOL_VIOLATION
    assert "needs 3 byte(s)" in info.value.message


def test_open_reader_reports_overrun_as_need_more_data() -> None:
    r = Reader(b"\x10\x01", final=False)
    assert r.vi64("Type") == 0x10
    with pytest.raises(NeedMoreData) as info:
        r.take(5, "Payload")
    assert (info.value.field, info.value.offset) == ("Payload", 1)


def test_reader_primitives_and_sub() -> None:
    r = Reader(bytes.fromhex("0102 ab 03 aabbcc 99"))
    assert r.u16("u16") == 0x0102
    assert r.u8("u8") == 0xAB
    inner = r.sub(r.vi64("len"), "inner")
    assert inner.rest() == b"\xaa\xbb\xcc"
    assert r.take(1, "tail") == b"\x99"
    assert r.at_end()
    with pytest.raises(MoqtDecodeError) as info:
        r.u8("after")
    assert info.value.offset == 8
