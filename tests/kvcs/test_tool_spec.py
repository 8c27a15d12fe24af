"""`kvconform kvcs spec` writes a cache spec the publisher and consumer load, and its producer key."""

from __future__ import annotations

from pathlib import Path

from kvconform.kvcs.content import CacheSpec
from kvconform.kvcs.cose import ProducerKey, sign, verify
from kvconform.kvcs.tool import main


def test_spec_with_segments_and_a_signing_key(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    assert main(["spec", "--out", str(out), "--layers", "3", "--blocks", "5", "--block-tokens", "4",
                 "--kv-heads", "1", "--head-dim", "8", "--segments", "8", "--sign", "ES256", "--kid", "p7"]) == 0
    spec = CacheSpec.load(out)
    assert spec.layers == 3 and [s.blocks for s in spec.segment_layout()] == [5, 2]
    assert spec.signing is not None and spec.signing["kid"] == "p7"
    key = ProducerKey.from_pem("ES256", b"p7", spec.signing["private_pem"])
    public = (tmp_path / "spec.json.pub.pem").read_text()
    assert verify(sign(b"m", key), {b"p7": public}) == b"m"


def test_a_spec_that_cannot_exist_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["spec", "--out", str(tmp_path / "s.json"), "--blocks", "0"]) == 2
    assert not (tmp_path / "s.json").exists()
