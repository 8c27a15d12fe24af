"""Testbeds, target specs and PICS."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvconform.targets import testbed as tb
from kvconform.targets.spec import Pics, TargetError, parse_target

LOCAL_GEOMETRY = {"block_tokens": 16, "n_layers": 3, "n_kv_heads": 2, "head_dim": 8}
SERVE_GEOMETRY = {"block_tokens": 16, "n_layers": 32, "n_kv_heads": 8, "head_dim": 128}


def test_loopback_declares_the_pics_the_suites_rely_on() -> None:
    bed = tb.load_testbed()
    assert bed.name == "loopback"
    ref = bed.targets["reference"]
    assert {"tlkv-writer", "tlkv-reader", "tlkv-decode", "tlkv-prefill"} <= set(ref["roles"])
    tlkv = ref["pics"]["tlkv"]
    assert tlkv["reader"]["geometry"] == LOCAL_GEOMETRY and tlkv["decode"]["geometry"] == LOCAL_GEOMETRY
    assert all(tlkv[r]["versions"] == [1, 2] for r in ("writer", "reader", "decode", "prefill"))
    assert bed.default_pics["tlkv"]["decode"]["geometry"] == SERVE_GEOMETRY


def test_example_testbed_is_valid() -> None:
    bed = tb.load_testbed(Path(tb.default_testbed_path()).parent / "rdma-hardware.example.yaml")
    spec = parse_target("acme-decode", bed)
    assert spec.kind == "url" and spec.roles == {"tlkv-decode"}
    assert spec.params["port"] == 50051 and spec.params["connect_timeout_s"] == 5


def test_errors_name_file_and_json_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ntargets:\n  x: {driver: url, roles: [tlkv-decode]}\n")
    with pytest.raises(tb.TestbedError) as info:
        tb.load_testbed(path)
    assert f"{path}: $.targets.x: 'url' is a required property" in str(info.value)
    path.write_text("name: bad\ntargets: {x: {driver: ssh}}\n")
    with pytest.raises(tb.TestbedError, match=r"\$.targets.x.driver: 'ssh' is not one of"):
        tb.load_testbed(path)
    with pytest.raises(tb.TestbedError, match="cannot read"):
        tb.load_testbed(tmp_path / "missing.yaml")


def test_pics_schema_is_used_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    schemas = tmp_path / "schema"
    schemas.mkdir()
    shutil.copy(tb.schema_dir() / "testbed.schema.json", schemas)
    monkeypatch.setattr(tb, "schema_dir", lambda: schemas)
    bed = tmp_path / "t.yaml"
    bed.write_text("name: t\ntargets: {r: {driver: reference, pics: {tlkv: {decode: 5}}}}\n")
    assert tb.load_testbed(bed).targets["r"]["pics"]["tlkv"]["decode"] == 5  # no pics schema: any object
    (schemas / "pics-tlkv.schema.json").write_text(json.dumps(
        {"type": "object", "properties": {"decode": {"type": "object"}}}))
    with pytest.raises(tb.TestbedError, match=r"\$.targets.r.pics.tlkv.decode: 5 is not of type 'object'"):
        tb.load_testbed(bed)


def test_parse_target_forms() -> None:
    bed = tb.load_testbed()
    ref = parse_target("reference", bed)
    assert ref.kind == "reference" and ref.roles is not None and "tlkv-reader" in ref.roles
    assert ref.pics["tlkv"]["decode"]["geometry"] == LOCAL_GEOMETRY and "targets.reference" in ref.source
    url = parse_target("grpc://127.0.0.1:7001?tls=0", bed)
    assert url.roles == {"tlkv-decode"} and url.params == {
        "scheme": "grpc", "host": "127.0.0.1", "port": 7001, "tls": "0"}
    assert url.pics["tlkv"]["decode"]["geometry"] == SERVE_GEOMETRY and url.source.startswith("testbed defaults")
    cmd = parse_target("cmd:server --port {port}", bed)
    assert (cmd.kind, cmd.value, cmd.roles) == ("cmd", "server --port {port}", {"tlkv-decode"})
    py = parse_target("python:tests.mutants.x:make", bed)
    assert (py.kind, py.value) == ("python", "tests.mutants.x:make")
    for bad, why in [("moqt+x://h:1", "scheme 'moqt\\+x'"), ("python:nocolon", "python:<module>:<factory>"),
                     ("cmd:", "command line"), ("elsewhere", "targets: reference")]:
        with pytest.raises(TargetError, match=why):
            parse_target(bad, bed)


def test_pics_overrides_are_applied_last_and_recorded() -> None:
    bed = tb.load_testbed()
    spec = parse_target("reference", bed, ["tlkv.decode.versions=[1]", "tlkv.reader.v1_only_mode=false"])
    assert spec.pics["tlkv"]["decode"]["versions"] == [1] and spec.pics["tlkv"]["reader"]["v1_only_mode"] is False
    assert spec.overrides == ["tlkv.decode.versions=[1]", "tlkv.reader.v1_only_mode=false"]
    assert "--pics-set tlkv.decode.versions=[1]" in spec.source
    assert bed.targets["reference"]["pics"]["tlkv"]["decode"]["versions"] == [1, 2]  # testbed untouched
    with pytest.raises(TargetError, match="expected KEY=VALUE"):
        parse_target("reference", bed, ["novalue"])
    with pytest.raises(TargetError, match="expected a mapping"):
        parse_target("reference", bed, ["tlkv.decode.versions.x=1"])


def test_pics_require() -> None:
    pics = Pics({"tlkv": {"decode": {"versions": [1, 2], "off": False}}}, "unit")
    assert pics.get("tlkv.decode.versions") == [1, 2] and pics.get("tlkv.x.y", 9) == 9
    assert pics.declared("tlkv.decode") and not pics.declared("tlkv.decode.off")
    assert pics.require("tlkv.decode.versions", 2) == [1, 2]
    for path, value in [("tlkv.decode.off", None), ("tlkv.kbtp", None), ("tlkv.decode.versions", 3)]:
        with pytest.raises(pytest.skip.Exception, match=f"^not-applicable: .*{path}"):
            pics.require(path, value)


@pytest.mark.parametrize(("override", "why"), [
    ("tlkv.writer.versions=banana", r"PICS tlkv.writer.versions: 'banana' is not of type 'array'"),
    ("tlkv.writer.versions=[3]", r"PICS tlkv.writer.versions.0: 3 is not one of \[1, 2\]"),
    ("tlkv.writer.verisons=[1]", r"PICS tlkv.writer: Additional properties are not allowed \('verisons'"),
    ("kbtp.target.quota=-1", r"PICS kbtp.target.quota: -1 is less than the minimum"),
    ("nosuchproto.x=1", r"PICS \(top\): Additional properties are not allowed \('nosuchproto'"),
])
def test_pics_overrides_are_checked_against_the_schema(override: str, why: str) -> None:
    with pytest.raises(TargetError, match=why):
        parse_target("reference", tb.load_testbed(), [override])


@pytest.mark.parametrize(("url", "why"), [
    ("grpc://127.0.0.1", "port: missing"),
    ("grpc://127.0.0.1:0", "port 0: expected 1..65535"),
    ("grpc://127.0.0.1:65536", "expected an integer 1..65535"),
    ("grpc://127.0.0.1:http", "port 'http'"),
    ("grpc://:50051", "host: missing"),
    ("grpc://bad_host!:50051", "neither an IP address nor a host name"),
    ("grpcx://127.0.0.1:1", "not handled by any lane"),
])
def test_malformed_urls_are_usage_errors(url: str, why: str) -> None:
    with pytest.raises(TargetError, match=why):
        parse_target(url, tb.load_testbed())


def test_ad_hoc_targets_mark_their_defaulted_pics() -> None:
    bed = tb.load_testbed()
    url = parse_target("grpc://127.0.0.1:50051", bed, ["tlkv.decode.versions=[1, 2]"])
    assert "tlkv.decode.geometry.block_tokens" in url.defaulted
    assert "tlkv.decode.versions" not in url.defaulted  # declared on the command line
    pics = Pics(url.pics, url.source, url.defaulted)
    assert pics.is_defaulted("tlkv.decode.geometry") and not pics.is_defaulted("tlkv.decode.versions")
    assert parse_target("reference", bed).defaulted == []  # a named target declares its own
