"""`kvconform tlkv export|import|prefill` and the sequence-file convention they share."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kvconform.tlkv.content import make_kv, read_sequence, write_sequence
from kvconform.tlkv.decode import DecodeSide
from kvconform.tlkv.envelope import encode_sequence
from kvconform.tlkv.geometry import Geometry
from kvconform.tlkv.grpc_decode import DecodeServer
from kvconform.tlkv.prefill import full_block_hashes
from kvconform.tlkv.reader import read_envelope
from kvconform.tlkv.tool import main
from tests.tlkv.helpers import GEOMETRY, TOKENS

Serve = Callable[..., DecodeServer]
PROC_TIMEOUT = 60.0


@pytest.fixture
def sequence_file(tmp_path: Path) -> Path:
    kv = make_kv(np.random.default_rng(11), GEOMETRY, 3, garbage_tail=True)
    return write_sequence(tmp_path / "seq.json", geometry=GEOMETRY, version=1, tokens=TOKENS,
                          request_id="tool-1", kv=kv)


# -- content ----------------------------------------------------------------------------------------


def test_sequence_file_round_trip(tmp_path: Path) -> None:
    kv = make_kv(np.random.default_rng(1), GEOMETRY, 3, garbage_tail=True)
    path = write_sequence(tmp_path / "sub" / "s.json", geometry=GEOMETRY, version=2, tokens=TOKENS,
                          request_id="r", kv=kv)
    doc = json.loads(path.read_text())
    assert doc["kv_file"] == "s.kv.f16" and doc["geometry"] == GEOMETRY.as_dict()
    assert (path.parent / "s.kv.f16").stat().st_size == kv.size * 2  # raw f16, no header
    seq = read_sequence(path)
    assert (seq.geometry, seq.version, seq.tokens, seq.request_id) == (GEOMETRY, 2, TOKENS, "r")
    np.testing.assert_array_equal(seq.kv, kv)


def test_sequence_file_is_little_endian_f16_in_c_order(tmp_path: Path) -> None:
    kv = make_kv(np.random.default_rng(1), GEOMETRY, 3, garbage_tail=True)
    path = write_sequence(tmp_path / "s.json", geometry=GEOMETRY, version=1, tokens=TOKENS, request_id="r", kv=kv)
    raw = (tmp_path / "s.kv.f16").read_bytes()
    assert raw[:2] == kv[0, 0, 0, 0, 0, 0].astype("<f2").tobytes()
    assert raw[2:4] == kv[0, 0, 0, 0, 0, 1].astype("<f2").tobytes()  # D varies fastest
    assert path.exists()


def test_read_sequence_refuses_a_short_kv_file(sequence_file: Path) -> None:
    kv_path = sequence_file.parent / "seq.kv.f16"
    kv_path.write_bytes(kv_path.read_bytes()[:-2])
    with pytest.raises(ValueError, match="kv_file"):
        read_sequence(sequence_file)


def test_make_kv_is_finite_nonzero_and_varied() -> None:
    kv = make_kv(np.random.default_rng(5), GEOMETRY, 4, garbage_tail=True)
    assert kv.dtype == np.float16 and kv.shape == (4, *GEOMETRY.kv_shape)
    assert np.isfinite(kv).all() and (kv != 0).all()
    slab_max = np.abs(kv.astype(np.float32)).max(axis=(4, 5))
    assert slab_max.max() / slab_max.min() > 16  # magnitudes differ from slab to slab
    assert make_kv(np.random.default_rng(5), GEOMETRY, 4, garbage_tail=True).tobytes() == kv.tobytes()


def test_make_kv_without_garbage_zeroes_past_the_fill() -> None:
    kv = make_kv(np.random.default_rng(5), GEOMETRY, 2, garbage_tail=False, last_fill=3)
    assert not kv[1, :, :, :, 3:, :].any() and (kv[1, :, :, :, :3, :] != 0).all()
    assert (kv[0] != 0).all()


# -- export / import --------------------------------------------------------------------------------


def test_export_writes_the_checked_envelope(sequence_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "env.bin"
    assert main(["export", "--sequence", str(sequence_file), "--out", str(out)]) == 0
    seq = read_sequence(sequence_file)
    assert out.read_bytes() == encode_sequence(GEOMETRY, 1, TOKENS, seq.kv)
    env = read_envelope(out.read_bytes(), geometry=GEOMETRY, versions={1})
    assert [(r.block_hash, r.n_tokens) for r in env.records] == [
        *[(h, 4) for h in full_block_hashes(TOKENS, 4)], (0, 2)]


@pytest.mark.parametrize("version", [1, 2])
def test_import_ok_writes_blocks_and_f32_values(tmp_path: Path, version: int) -> None:
    kv = make_kv(np.random.default_rng(2), GEOMETRY, 3, garbage_tail=False, last_fill=2)
    envelope = tmp_path / "e.bin"
    envelope.write_bytes(encode_sequence(GEOMETRY, version, TOKENS, kv))
    result_path = tmp_path / "result.json"
    assert main(["import", "--envelope", str(envelope), "--pool", str(GEOMETRY), "--versions", "1,2",
                 "--out", str(result_path)]) == 0
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok" and result["requirement"] is None and result["version"] == version
    assert result["blocks"] == [{"block_hash": h, "n_tokens": n}
                                for h, n in zip([*full_block_hashes(TOKENS, 4), 0], [4, 4, 2], strict=True)]
    values = np.fromfile(tmp_path / result["kv_file"], "<f4").reshape(3, *GEOMETRY.kv_shape)
    if version == 1:
        np.testing.assert_array_equal(values, kv.astype(np.float32))
    else:  # e4m3: 3 mantissa bits, so within 1/16 relative of each value
        np.testing.assert_allclose(values, kv.astype(np.float32), rtol=1 / 16, atol=0)


@pytest.mark.parametrize(("pool", "versions", "status", "requirement"), [
    ("4,2,2,16", "1,2", "shape", "TLKV-READ-SHAPE"),
    ("4,2,2,8", "1", "version", "TLKV-READ-VERSION"),
])
def test_import_rejections(tmp_path: Path, pool: str, versions: str, status: str, requirement: str) -> None:
    kv = make_kv(np.random.default_rng(2), GEOMETRY, 3, garbage_tail=True)
    envelope = tmp_path / "e.bin"
    envelope.write_bytes(encode_sequence(GEOMETRY, 2, TOKENS, kv))
    result_path = tmp_path / "r.json"
    assert main(["import", "--envelope", str(envelope), "--pool", pool, "--versions", versions,
                 "--out", str(result_path)]) == 1
    result = json.loads(result_path.read_text())
    assert (result["status"], result["requirement"]) == (status, requirement)
    assert requirement in result["message"] and result["blocks"] == [] and result["kv_file"] is None


def test_import_format_error(tmp_path: Path) -> None:
    envelope = tmp_path / "e.bin"
    envelope.write_bytes(b"TLKV" + bytes(40))
    result_path = tmp_path / "r.json"
    assert main(["import", "--envelope", str(envelope), "--pool", str(GEOMETRY), "--out", str(result_path)]) == 1
    assert json.loads(result_path.read_text())["status"] == "format"


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert main(["import", "--envelope", "x", "--pool", "1,2,3", "--out", "y"]) == 2
    assert main(["import", "--envelope", "x", "--pool", "1,2,3,4", "--versions", "3", "--out", "y"]) == 2
    assert main(["export", "--sequence", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o")]) == 2
    assert main([]) == 2


# -- prefill ----------------------------------------------------------------------------------------


def test_prefill_against_the_reference_decode_side(serve: Serve, side: DecodeSide, sequence_file: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(side)
    assert main(["prefill", "--decode", server.address, "--sequence", str(sequence_file), "--timeout", "10"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "OK" and report["held"] == [False, False]
    assert report["bytes_moved"] == 3 * GEOMETRY.envelope_size(1, 1) == report["payload_bytes"]
    assert side.has_blocks(full_block_hashes(TOKENS, 4)) == [True, True]
    assert len(side.pool.partial_blocks("tool-1")) == 1


def test_prefill_reports_a_refusal(serve: Serve, sequence_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = serve(DecodeSide(Geometry(4, 2, 2, 16), frozenset({1})))  # another pool geometry
    assert main(["prefill", "--decode", server.address, "--sequence", str(sequence_file), "--timeout", "10"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "DATA_LOSS" and "TLKV-READ-SHAPE" in captured.err


# -- as a spawned process -----------------------------------------------------------------------------


def test_spawned_through_the_cli(sequence_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "env.bin"
    proc = subprocess.run([sys.executable, "-m", "kvconform.cli", "tlkv", "export", "--sequence",
                           str(sequence_file), "--out", str(out)],
                          capture_output=True, text=True, timeout=PROC_TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    result = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "kvconform.tlkv.tool", "import", "--envelope", str(out),
                           "--pool", str(GEOMETRY), "--versions", "1", "--out", str(result)],
                          capture_output=True, text=True, timeout=PROC_TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result.read_text())["status"] == "ok"
