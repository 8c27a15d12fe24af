"""Scapy layers: crafting is byte-identical to the checked encoder, dissection never raises."""

from __future__ import annotations

import struct
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform.checksum import crc32c
from kvconform.tlkv.envelope import Block, encode_envelope, encode_raw, sequence_blocks
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.layers import TLKVEnvelope, TLKVRecord, craft, dissect
from kvconform.tlkv.reader import FormatError, VersionError, read_envelope

SPEC_ENVELOPE = bytes.fromhex(
    "544c4b56010001000100000002000000" "010000000100000002000000" "66937b02c1b01aa902000000"
    "003c004000420044" "003800bc00000034" "1c540b4f"
)
SPEC_GEOMETRY = Geometry(2, 1, 1, 2)


def _blocks(g: Geometry, count: int, seed: int = 1) -> list[Block]:
    rng = np.random.default_rng(seed)
    tokens = [int(t) for t in rng.integers(0, 2**32, count)]
    n = -(-count // g.block_tokens)
    return sequence_blocks(g, tokens, rng.uniform(-3, 3, (n, *g.kv_shape)).astype(np.float16))


CASES = [(Geometry(2, 1, 1, 2), 3), (Geometry(3, 2, 1, 4), 7), (Geometry(1, 1, 1, 1), 2), (Geometry(4, 1, 2, 3), 0),
         (Geometry(16, 1, 1, 2), 20)]


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("geometry", "count"), CASES)
def test_no_overrides_is_byte_identical(geometry: Geometry, count: int, version: int) -> None:
    blocks = _blocks(geometry, count)
    expected = encode_envelope(geometry, version, blocks)
    assert craft(geometry, version, blocks) == expected
    assert bytes(dissect(expected)) == expected
    built = TLKVEnvelope(version=version, block_tokens=geometry.block_tokens, n_layers=geometry.n_layers,
                         n_kv_heads=geometry.n_kv_heads, head_dim=geometry.head_dim, records=[
                             TLKVRecord(block_hash=r.block_hash, n_tokens=r.n_tokens, data=bytes(r.payload))
                             for r in read_envelope(expected, geometry=geometry).records])
    assert bytes(built) == expected  # dtype, n_blocks and crc32c computed when left None


def test_dissect_worked_example() -> None:
    env = dissect(SPEC_ENVELOPE)
    assert (env.magic, env.version, env.dtype, env.n_blocks) == (b"TLKV", 1, 1, 1)
    assert (env.block_tokens, env.n_layers, env.n_kv_heads, env.head_dim) == (2, 1, 1, 2)
    assert len(env.records) == 1
    rec = env.records[0]
    assert (rec.block_hash, rec.n_tokens) == (0xA91AB0C1027B9366, 2)
    assert rec.data == bytes.fromhex("003c004000420044003800bc00000034")
    assert env.trailing == b"" and env.crc32c == 0x4F0B541C


def test_override_changes_exactly_that_field_and_recomputes_crc() -> None:
    blocks = _blocks(SPEC_GEOMETRY, 3)
    base = encode_envelope(SPEC_GEOMETRY, 1, blocks)
    data = craft(SPEC_GEOMETRY, 1, blocks, **{"records[1].n_tokens": 0})
    changed = [i for i, (a, b) in enumerate(zip(base, data, strict=True)) if a != b]
    offset = 28 + (12 + 16) + 8  # records[1].n_tokens
    assert set(changed) - set(range(len(data) - 4, len(data))) == {offset}
    assert struct.unpack_from("<I", data, offset)[0] == 0
    with pytest.raises(FormatError) as info:
        read_envelope(data, geometry=SPEC_GEOMETRY)
    assert info.value.requirement == "TLKV-READ-NTOKENS"  # not a CRC failure: the CRC was recomputed


def test_header_override_keeps_other_fields_explicit() -> None:
    blocks = _blocks(SPEC_GEOMETRY, 2)
    data = craft(SPEC_GEOMETRY, 1, blocks, version=2)
    env = dissect(data)
    assert (env.version, env.dtype) == (2, 1)  # dtype was dissected, so it stays 1
    with pytest.raises(FormatError) as info:
        read_envelope(data, geometry=SPEC_GEOMETRY)
    assert info.value.requirement == "TLKV-READ-DTYPE"  # the explicit dtype 1 no longer matches version 2


def test_crc_override_is_written_verbatim_and_payload_alias() -> None:
    blocks = _blocks(SPEC_GEOMETRY, 2)
    assert craft(SPEC_GEOMETRY, 1, blocks, crc32c=0x01020304)[-4:] == bytes([4, 3, 2, 1])
    data = craft(SPEC_GEOMETRY, 1, blocks, **{"records[0].payload": b"\x01" * 16})
    assert dissect(data).records[0].data == b"\x01" * 16
    assert struct.unpack("<I", data[-4:])[0] == crc32c(data[:-4])


def test_unknown_override_and_missing_dtype_raise() -> None:
    with pytest.raises(KeyError, match="nope"):
        craft(SPEC_GEOMETRY, 1, [], nope=1)
    with pytest.raises(KeyError, match="records"):
        craft(SPEC_GEOMETRY, 1, [], **{"records[0].n_tokens": 1})
    with pytest.raises(ValueError, match="TLKV-ENV-DTYPE"):
        bytes(TLKVEnvelope(version=7))


def test_dissect_unknown_version_keeps_rest_raw() -> None:
    data = craft(SPEC_GEOMETRY, 1, _blocks(SPEC_GEOMETRY, 2), version=7)
    env = dissect(data)
    assert env.records == [] and len(env.trailing) == len(data) - 32
    assert bytes(env) == data
    with pytest.raises(VersionError):
        read_envelope(data, geometry=SPEC_GEOMETRY)


def test_dissect_count_that_does_not_fit() -> None:
    data = craft(SPEC_GEOMETRY, 1, _blocks(SPEC_GEOMETRY, 2), n_blocks=5, trailing=b"\xaa\xbb")
    env = dissect(data)
    assert env.n_blocks == 5 and len(env.records) == 1 and env.trailing == b"\xaa\xbb"
    assert bytes(env) == data


def test_dissect_short_input_does_not_raise() -> None:
    env = dissect(b"TLKV\x01\x00\x01")
    assert env.magic == b"TLKV" and env.version == 1 and env.trailing == b"\x01"
    assert dissect(b"").records == []


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=160))
def test_dissect_rebuilds_any_input(data: bytes) -> None:
    assert bytes(dissect(data)) == data


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 4), st.integers(0, 3), st.binary(max_size=120))
def test_dissect_rebuilds_plausible_headers(version: int, n_blocks: int, rest: bytes) -> None:
    data = encode_raw(version=version, dtype=1, n_blocks=n_blocks, block_tokens=2, n_layers=1, n_kv_heads=1,
                      head_dim=2, records=[]) [:-4] + rest + b"\0\0\0\0"
    env = dissect(data)
    assert bytes(env) == data
    assert len(env.records) <= n_blocks


def test_import_prints_nothing() -> None:
    out = subprocess.run([sys.executable, "-c", "import kvconform.tlkv.layers"], capture_output=True, text=True,
                         check=True)
    assert out.stdout == "" and out.stderr == ""
