"""The kvconform command line."""

from __future__ import annotations

import gc
import json
import sys
import textwrap
import types
from pathlib import Path

import pytest

from kvconform import cli, components

CATALOG = """\
protocol: demo
title: Demo
source: demo.txt
roles: [reader, writer]
suites: {demo-reader: reader, demo-writer: writer}
requirements:
  - {id: DEMO-A, section: S, level: MUST, roles: [reader, writer], text: a}
  - {id: DEMO-B, section: S, level: SHOULD, roles: [reader], text: b}
"""

TESTBED = """\
name: demo
targets:
  readeronly: {driver: reference, roles: [demo-reader], pics: {tlkv: {writer: {versions: [1]}}}}
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A conformance folder with two demo suites, a catalog and a testbed."""
    root = tmp_path / "conformance"
    for role, body in [("reader", """\
            import pytest
            @pytest.mark.req("DEMO-A")
            def test_a(pics):
                assert pics.require("tlkv.writer.versions") == [1]
            @pytest.mark.req("DEMO-B")
            def test_b():
                assert 0, "should-level"
        """), ("writer", """\
            import pytest
            @pytest.mark.req("DEMO-A")
            def test_w():
                pass
        """)]:
        (root / "demo" / role).mkdir(parents=True)
        (root / "demo" / role / f"test_{role}.py").write_text(textwrap.dedent(body))
    (root / "requirements").mkdir()
    (root / "requirements" / "demo.yaml").write_text(CATALOG)
    (tmp_path / "tb.yaml").write_text(TESTBED)
    monkeypatch.setattr(cli, "conformance_dir", lambda: root)
    monkeypatch.setenv("KVCONFORM_CATALOG_DIR", str(root / "requirements"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_discover_and_select(tree: Path) -> None:
    suites = cli.discover_suites()
    assert list(suites) == ["demo-reader", "demo-writer"]
    assert cli.select_suites("demo", list(suites), None, "t") == (["demo-reader", "demo-writer"], [])
    assert cli.select_suites("all", list(suites), {"demo-reader"}, "t") == (["demo-reader"], ["demo-writer"])
    with pytest.raises(cli.UsageError, match="target 't' does not play suite 'demo-writer'; it plays: demo-reader"):
        cli.select_suites("demo-writer", list(suites), {"demo-reader"}, "t")
    with pytest.raises(cli.UsageError, match=r"unknown suite 'nope'.*demo-reader"):
        cli.select_suites("nope", list(suites), None, "t")


def test_run_protocol_leaves_out_unplayed_suites(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["run", "demo", "--testbed", "tb.yaml", "--target", "readeronly", "--report-dir", "rep",
                     "--seed", "5", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, out + err  # the SHOULD failure does not gate without --strict
    assert "does not play demo-writer" in err
    doc = json.loads((tree / "rep" / "coverage.json").read_text())
    assert {t["nodeid"].split("::")[-1]: t["verdict"] for t in doc["tests"]} == {"test_a": "pass",
                                                                               "test_b": "fail"}
    assert doc["meta"]["seed"] == 5
    for name in ("coverage.html", "junit.xml", "allure-results"):
        assert (tree / "rep" / name).exists()
        assert f"kvconform: {name}: " in out
    code = cli.main(["run", "demo-reader", "--testbed", "tb.yaml", "--target", "readeronly",
                     "--report-dir", "rep2", "--strict", "-q"])
    assert code == 1


def test_a_run_leaves_the_garbage_collector_as_it_found_it(tree: Path) -> None:
    # A run keeps the collector off while it starts and freezes what it built once the checks start
    # (cli._run_pytest): its caller's collector is as it was afterwards, with nothing left frozen.
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            assert cli.main(["run", "demo-writer", "--report-dir", f"rep-{enabled}", "-q",
                             "--target", "python:json:dumps"]) == 0
            assert gc.isenabled() is enabled and gc.get_freeze_count() == 0
        finally:
            gc.enable()


def test_run_usage_errors(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "demo-writer", "--testbed", "tb.yaml", "--target", "readeronly"]) == 2
    assert "plays: demo-reader" in capsys.readouterr().err
    assert cli.main(["run", "demo", "--target", "ftp://x"]) == 2
    assert "scheme 'ftp'" in capsys.readouterr().err


def test_report_html_regenerates(tree: Path) -> None:
    assert cli.main(["run", "demo-writer", "--report-dir", "rep", "-q", "--target", "python:json:dumps"]) == 0
    assert cli.main(["report", "html", "--from", "rep/coverage.json", "--out", "page.html"]) == 0
    page = (tree / "page.html").read_text()
    assert "test_w" in page and "PASSED" in page
    assert cli.main(["report", "html", "--from", "missing.json", "--out", "p.html"]) == 2


def test_dispatch_to_missing_modules(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "no-such-component"]) == 2
    assert "components: " in capsys.readouterr().err
    assert cli.main(["nosuchproto", "export"]) == 2
    assert "kvconform.nosuchproto.tool" in capsys.readouterr().err


def test_serve_dispatches_to_components(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[list[str]] = []

    def echo(argv: list[str], stop: object) -> int:
        seen.append(argv)
        return 7

    monkeypatch.setitem(sys.modules, "tests_fake_component", types.SimpleNamespace(echo=echo))
    monkeypatch.setattr(components, "COMPONENTS", {"echo": "tests_fake_component:echo"})
    monkeypatch.setattr(cli, "COMPONENTS", components.COMPONENTS)
    assert cli.main(["serve", "echo", "--port", "1"]) == 7
    assert seen == [["--port", "1"]]
    assert cli.main(["serve", "other"]) == 2
    assert "components: echo" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kvconform ")


@pytest.mark.parametrize("args", [["--timeout", "0"], ["--timeout", "-1"], ["--timeout", "inf"],
                                  ["--suite-budget", "0"], ["--pics-set", "tlkv.writer.versions=banana"],
                                  ["--target", "grpc://127.0.0.1:0"], ["--target", "grpc://127.0.0.1"],
                                  ["--target", "cmd:tool 'unbalanced"], ["--target", "cmd:tool --no-placeholders"]])
def test_bad_run_arguments_are_one_line_usage_errors(tree: Path, capsys: pytest.CaptureFixture[str],
                                                     args: list[str]) -> None:
    assert cli.main(["run", "demo-reader", "--report-dir", "rep", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err, err
    assert not (tree / "rep" / "coverage.json").exists()


def test_an_unwritable_report_dir_is_a_usage_error(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "afile").write_text("")
    assert cli.main(["run", "demo-reader", "--report-dir", "afile/rep", "--target", "python:json:dumps"]) == 2
    assert "--report-dir afile/rep: cannot write there" in capsys.readouterr().err


def test_a_run_that_aborts_never_shows_an_older_report(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rep = tree / "rep"
    (rep / "evidence").mkdir(parents=True)
    (rep / "coverage.json").write_text('{"format": "kvconform-coverage/1", "old": true}')
    (rep / "junit.xml").write_text("<old/>")
    (tree / "conformance" / "demo" / "reader" / "test_broken.py").write_text(
        "import pytest\n@pytest.mark.req('DEMO-NOPE')\ndef test_x():\n    pass\n")
    code = cli.main(["run", "demo-reader", "--report-dir", "rep", "--target", "python:json:dumps"])
    out = capsys.readouterr().out
    assert code != 0
    assert not (rep / "coverage.json").exists() and not (rep / "junit.xml").read_text().startswith("<old")
    assert "kvconform: coverage.json:" not in out


def test_serve_port_out_of_range_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "tlkv-decode", "--port", "99999"]) == 2
    err = capsys.readouterr().err
    assert err == ("kvconform serve tlkv-decode: error: argument --port: 99999: expected a port 0..65535 "
                   "(0 picks a free one)\n")
