"""The Identity block's parts: the implementation a testbed entry declares, the spec texts found from a catalog's
source path (or "not available"), the harness commit, the PICS values with their origin."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kvconform import __version__
from kvconform.catalog import load_catalogs
from kvconform.reports.identity import SPEC_DIR_ENV, build_identity, find_spec_text, harness_commit, pics_values
from kvconform.targets.spec import parse_target
from kvconform.targets.testbed import TestbedError, default_testbed_path, load_testbed

ROOT = Path(__file__).resolve().parents[1]


def test_the_loopback_reference_names_this_kvconform() -> None:
    """The reference entry's implementation version is kvconform's own: it cannot go stale unnoticed."""
    target = parse_target("reference", load_testbed(None))
    assert target.implementation == {"name": "kvconform reference implementations", "vendor": "kvconform project",
                                     "version": __version__}
    assert target.describe()["implementation"] == target.implementation


def test_the_vendor_example_declares_every_identity_field() -> None:
    bed = load_testbed(ROOT / "testbeds" / "rdma-hardware.example.yaml")
    target = parse_target("acme-decode", bed)
    assert set(target.implementation) == {"name", "vendor", "version", "build", "firmware"}
    assert parse_target("grpc://127.0.0.1:50051", bed).implementation == {}, "an ad-hoc target declares none"


@pytest.mark.parametrize(("implementation", "complaint"), [
    ({"vendor": "ACME"}, "'name' is a required property"),
    ({"name": "x", "serial": "1"}, "Additional properties"),
    ({"name": "x", "version": 4}, "is not of type 'string'"),
])
def test_the_testbed_schema_checks_the_implementation(tmp_path: Path, implementation: dict[str, object],
                                                      complaint: str) -> None:
    doc = {"name": "lab", "targets": {"t": {"driver": "url", "url": "grpc://127.0.0.1:1",
                                            "implementation": implementation}}}
    path = tmp_path / "bed.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(TestbedError, match="implementation") as info:
        load_testbed(path)
    assert complaint in str(info.value)


def test_spec_texts_are_found_beside_a_checkout_or_reported_missing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPEC_DIR_ENV, raising=False)
    checkout = tmp_path / "work" / "main"
    catalog = checkout / "conformance" / "requirements" / "demo.yaml"
    catalog.parent.mkdir(parents=True)
    catalog.write_text("")
    text = tmp_path / "work" / "shared" / "spec" / "seeds" / "001.txt"
    text.parent.mkdir(parents=True)
    text.write_text("the text")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert find_spec_text("spec/seeds/001.txt", catalog, elsewhere) == text, "../shared/spec from the catalog"
    assert find_spec_text("spec/seeds/002.txt", catalog, elsewhere) is None
    installed = tmp_path / "site-packages" / "kvconform" / "conformance" / "requirements" / "demo.yaml"
    installed.parent.mkdir(parents=True)
    assert find_spec_text("spec/seeds/001.txt", installed, elsewhere) is None, "an installed package has none"
    assert find_spec_text("spec/seeds/001.txt", installed, checkout) == text, "... but a run from a checkout does"
    monkeypatch.setenv(SPEC_DIR_ENV, str(tmp_path / "work" / "shared"))
    assert find_spec_text("spec/seeds/001.txt", installed, elsewhere) == text


def test_an_identity_without_spec_texts_says_not_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SPEC_DIR_ENV, raising=False)
    folder = tmp_path / "catalogs"
    folder.mkdir()
    (folder / "demo.yaml").write_text("protocol: demo\ntitle: Demo\nsource: spec/seeds/nowhere.txt\nroles: [r]\n"
                                      "suites: {demo-r: r}\nrequirements: []\n")
    bed = load_testbed(None)
    target = parse_target("cmd:tool --sequence {sequence} --out {out}", bed, ["tlkv.writer.versions=[1, 2]"])
    ident = build_identity(target=target, testbed=bed, catalog=load_catalogs(folder), protocols=["demo"],
                           suites=["demo-r"], command=None, argv=["-q", "x"], cwd=str(tmp_path), seed=3,
                           strict=False, sweep="wide", started="s", finished="f", exit_code=0,
                           versions={"kvconform": "0"})
    (spec,) = ident["specs"]
    assert spec["text"]["available"] is False and spec["text"]["sha256"] is None
    assert "not available" in spec["text"]["note"] and SPEC_DIR_ENV in spec["text"]["note"]
    assert ident["run"] == {"command": "pytest -q x", "replayable": False, "cwd": str(tmp_path), "suites": ["demo-r"],
                            "seed": 3, "strict": False, "sweep": "wide", "started": "s", "finished": "f",
                            "exit_code": 0}
    assert ident["implementation"]["declared"] is False
    assert ident["testbed"]["file"] == str(default_testbed_path())


def test_pics_values_mark_defaulted_and_overridden() -> None:
    target = parse_target("cmd:tool --sequence {sequence} --out {out}", load_testbed(None),
                          ["tlkv.writer.versions=[1, 2]"])
    values = {v["path"]: v for v in pics_values(target)}
    assert values["tlkv.writer.versions"] == {"path": "tlkv.writer.versions", "value": [1, 2], "defaulted": False,
                                              "overridden": True}
    assert values["tlkv.reader.versions"]["defaulted"] and not values["tlkv.reader.versions"]["overridden"]
    named = {v["path"]: v for v in pics_values(parse_target("reference", load_testbed(None)))}
    assert not any(v["defaulted"] for v in named.values())


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout.strip()


def test_harness_commit(tmp_path: Path) -> None:
    assert harness_commit(tmp_path) == "unknown", "not a checkout"
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("1")
    _git(repo, "add", "f")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert harness_commit(repo) == head
    (repo / "f").write_text("2")
    assert harness_commit(repo) == head + "+dirty"
    inner = repo / "sub"
    inner.mkdir()
    (inner / ".git").write_text("")  # a folder inside another repository is not a checkout of its own
    assert harness_commit(inner) == "unknown"
