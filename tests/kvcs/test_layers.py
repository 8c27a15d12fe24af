"""The KVO1 scapy layer: dissection equals the codec's decode, rebuilds byte-identically, never raises, and
computes Data Length and Data Digest only when they are left None."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.packet import Raw

from kvconform.kvcs.layers import KVO1, craft, dissect, to_header
from kvconform.kvcs.payload import HEADER_LEN, decode_object, encode_object, verify_object
from kvconform.kvcs.vectors import SPEC_PAYLOAD_DATA, SPEC_PAYLOAD_HEADER

SPEC = SPEC_PAYLOAD_HEADER + SPEC_PAYLOAD_DATA


def test_dissect_the_texts_example() -> None:
    pkt = dissect(SPEC)
    assert (pkt.magic, pkt.version, pkt.component, pkt.flags, pkt.layer, pkt.block_index) == (0x4B564F31, 1, 1, 0, 0, 1)
    assert (pkt.token_start, pkt.token_count, pkt.codec, pkt.reserved, pkt.data_length) == (4, 4, 1, 0, 16)
    assert pkt.digest == SPEC_PAYLOAD_HEADER[36:] and pkt.data == SPEC_PAYLOAD_DATA
    assert to_header(pkt) == decode_object(SPEC)
    assert bytes(pkt) == SPEC


def test_layer_computes_length_and_digest_when_none() -> None:
    built = KVO1(component=1, layer=0, block_index=1, token_start=4, token_count=4, codec=1, data=SPEC_PAYLOAD_DATA)
    assert bytes(built) == SPEC, "the text's header byte for byte, Data Length and Data Digest computed"
    explicit = bytes(KVO1(layer=0, block_index=1, data_length=5, digest=bytes(32), data=SPEC_PAYLOAD_DATA))
    assert explicit[32:36] == b"\x00\x00\x00\x05" and explicit[36:68] == bytes(32), "given values are written as is"
    problems = verify_object(explicit, 0, 1)
    assert problems and "KVCS-PAYLOAD-VERIFY-LENGTH" in problems[0]


def test_craft_poisons_with_and_without_a_matching_digest() -> None:
    stale = craft(SPEC, data=b"\xff" * 16)
    assert stale[:HEADER_LEN] == SPEC_PAYLOAD_HEADER
    assert any("KVCS-PAYLOAD-VERIFY-DIGEST" in p for p in verify_object(stale, 0, 1))
    matching = craft(SPEC, data=b"\xff" * 16, digest=None, data_length=None)
    assert verify_object(matching, 0, 1) == [], "a poisoned object with a matching digest passes the digest check"
    assert any("KVCS-PAYLOAD-VERIFY-LAYER" in p for p in verify_object(craft(SPEC, layer=3), 0, 1))
    with pytest.raises(KeyError, match="nonsense"):
        craft(SPEC, nonsense=1)
    with pytest.raises(ValueError, match="shorter than the 68-octet header"):
        craft(SPEC[:40], layer=1)


@pytest.mark.parametrize("cut", [0, 1, 40, HEADER_LEN - 1])
def test_short_payload_is_kept_raw(cut: int) -> None:
    pkt = dissect(SPEC[:cut])
    assert pkt.is_short() and bytes(pkt) == SPEC[:cut]
    assert cut == 0 or isinstance(pkt.payload, Raw)
    with pytest.raises(ValueError, match="shorter than"):
        to_header(pkt)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_rebuild_identically(data: bytes) -> None:
    pkt = dissect(data)
    assert bytes(pkt) == data
    if len(data) >= HEADER_LEN:
        header, rest = to_header(pkt)
        assert header.encode() + rest == data


@settings(max_examples=200, deadline=None)
@given(component=st.integers(1, 3), layer=st.integers(0, 2**32 - 1), block=st.integers(0, 2**32 - 1),
       start=st.integers(0, 2**64 - 1), count=st.integers(0, 2**32 - 1), codec=st.integers(1, 0xFFFF),
       data=st.binary(max_size=100))
def test_layer_agrees_with_the_codec(component: int, layer: int, block: int, start: int, count: int, codec: int,
                                     data: bytes) -> None:
    payload = encode_object(component=component, layer=layer, block_index=block, token_start=start,
                            token_count=count, codec=codec, data=data)
    assert to_header(dissect(payload)) == decode_object(payload)
    assert bytes(KVO1(component=component, layer=layer, block_index=block, token_start=start, token_count=count,
                      codec=codec, data=data)) == payload
