"""``kvconform history`` on a store of runs written as data (tests/store/synthetic.py), on each backend: the
requirement × run table marks each verdict change, the flaky list is the gate's, latest.html follows the newest
run, and the run pages stay byte for byte when a later history adds runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from lxml import html

from kvconform.cli import main
from kvconform.store import RunRecord, open_store, read_report_dir
from tests.report_runs import BROKEN_REQUIREMENT, ReportRun
from tests.store.synthetic import history_runs


def history(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["history", *args])
    out, err = capsys.readouterr()
    return code, out, err


def record(store_url: str, runs: list[RunRecord]) -> list[int]:
    with open_store(store_url) as store:
        return [store.record(r) for r in runs]


def page(path: Path) -> html.HtmlElement:
    assert path.is_file(), f"{path} was not written"
    return html.fromstring(path.read_bytes())


def cells(doc: html.HtmlElement, row: str) -> list[tuple[str, bool]]:
    """(verdict, changed) of each run's cell in one row of the requirement × run table."""
    tds = doc.xpath(f"//table[@id='timeline']//tr[@data-row='{row}']/td")
    return [(td.get("data-verdict"), "changed" in td.get("class").split()) for td in tds]


def test_history_pages_show_changes_flaky_checks_and_the_latest_run(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = record(store_url, history_runs())
    out = tmp_path / "history"
    code, text, err = history(capsys, "--results-db", store_url, "--out", str(out))
    assert code == 0, err
    assert "4 runs of 2 implementations" in text and "4 run pages written, 0 kept" in text
    one, other = ids[0], ids[3]

    index = page(out / "index.html")
    rows = index.xpath("//table[@id='implementations']//tr[@data-identity]")
    assert [r.xpath("string(td[1])") for r in rows] == ["other 2", "impl 1"], "newest implementation first"
    flaky = {tr.get("data-flaky"): tr.text_content() for tr in index.xpath("//table[@id='flaky']//tr[@data-flaky]")}
    assert sorted(flaky) == ["t::a", "t::b"], "the gate's definition: verdicts differ across stored runs"
    assert f"#{ids[0]} pass #{ids[1]} fail #{ids[2]} pass" in " ".join(flaky["t::a"].split())

    slug = rows[1].get("data-identity")
    timeline = page(out / f"identity-{slug}.html")
    assert cells(timeline, "X-ONE") == [("pass", False), ("fail", True), ("pass", True)]
    assert cells(timeline, "X-TWO") == [("pass", False), ("pass", False), ("inconclusive", True)]
    assert cells(timeline, "X-STABLE") == [("pass", False)] * 3
    assert cells(timeline, "cell:a<b>") == [("pass", False)] * 3, "a check citing no requirement is its own row"
    order = [tr.get("data-row") for tr in timeline.xpath("//table[@id='timeline']//tr[@data-row]")]
    assert order[:2] == ["X-ONE", "X-TWO"], "the rows that changed come first"
    assert "cell:a&lt;b&gt;" in (out / f"identity-{slug}.html").read_text(), "names are escaped"
    heads = timeline.xpath("//table[@id='timeline']//thead//a/@href")
    assert heads == [f"runs/{i}.html" for i in ids[:3]]

    latest = page(out / "latest.html")
    assert latest.xpath("//h1[@id='run']/@data-run-id") == [str(other)]
    assert page(out / f"latest-{slug}.html").xpath("//h1[@id='run']/@data-run-id") == [str(ids[2])]
    run_page = page(out / f"runs/{ids[1]}.html")
    assert run_page.xpath("//h1[@id='run']/@data-run-id") == [str(ids[1])]
    assert run_page.xpath("//tr[@data-check='t::a']/@data-verdict") == ["fail"]
    assert run_page.xpath("//a[@class='previous']/@href") == [f"../runs/{one}.html"]


def test_run_pages_are_immutable_and_latest_follows_a_new_run(
        store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = record(store_url, history_runs())
    out = tmp_path / "history"
    assert history(capsys, "--results-db", store_url, "--out", str(out))[0] == 0
    before = {p.name: p.read_bytes() for p in (out / "runs").iterdir()}
    assert sorted(before) == sorted(f"{i}.html" for i in ids)
    newest = record(store_url, history_runs(more=True))[-1]
    code, text, err = history(capsys, "--results-db", store_url, "--out", str(out))
    assert code == 0, err
    assert "1 run pages written, 4 kept" in text
    after = {p.name: p.read_bytes() for p in (out / "runs").iterdir()}
    assert {k: v for k, v in after.items() if k in before} == before, "an existing run page is never rewritten"
    assert set(after) - set(before) == {f"{newest}.html"}
    assert page(out / "latest.html").xpath("//h1[@id='run']/@data-run-id") == [str(newest)]
    slug = page(out / "index.html").xpath("//tr[@data-identity][td[1]='impl 1']/@data-identity")[0]
    assert page(out / f"latest-{slug}.html").xpath("//h1[@id='run']/@data-run-id") == [str(newest)]
    timeline = page(out / f"identity-{slug}.html")
    assert cells(timeline, "X-ONE")[-1] == ("fail", True)
    assert cells(timeline, "X-TWO")[-1] == ("inconclusive", False)


def test_real_runs_render_with_their_requirements_and_evidence(
        reference: ReportRun, broken: ReportRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    good, bad = record(url, [read_report_dir(reference.report_dir), read_report_dir(broken.report_dir)])
    out = tmp_path / "history"
    assert history(capsys, "--results-db", url, "--out", str(out))[0] == 0
    failed = [t for t in broken.doc["tests"] if t["verdict"] == "fail"]
    run_page = page(out / f"runs/{bad}.html")
    for test in failed:
        row = run_page.xpath(f"//table[@id='checks']//tr[@data-check='{test['nodeid']}']")
        assert row and row[0].get("data-verdict") == "fail" and test["evidence"] in row[0].text_content()
    assert len(run_page.xpath("//table[@id='checks']//tr[@data-check]")) == len(broken.doc["tests"])
    slugs = page(out / "index.html").xpath("//tr[@data-identity]/@data-identity")
    assert len(slugs) == 2, "the reference and the mutant are two implementations"
    verdicts = {slug: cells(page(out / f"identity-{slug}.html"), BROKEN_REQUIREMENT) for slug in slugs}
    assert sorted(verdicts.values()) == [[("fail", False)], [("pass", False)]]
    assert page(out / "latest.html").xpath("//h1[@id='run']/@data-run-id") == [str(bad)] and good < bad


def test_a_folder_of_another_store_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    runs = history_runs()
    record(first, runs[:1])
    record(second, runs[1:2])  # run id 1 again, another run
    out = tmp_path / "history"
    assert history(capsys, "--results-db", first, "--out", str(out))[0] == 0
    kept = (out / "runs" / "1.html").read_bytes()
    code, _, err = history(capsys, "--results-db", second, "--out", str(out))
    assert code == 2 and "runs/1.html" in err and "another store" in err
    assert (out / "runs" / "1.html").read_bytes() == kept


def test_an_empty_store_and_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "history"
    code, text, _ = history(capsys, "--results-db", str(tmp_path / "empty.sqlite"), "--out", str(out))
    assert code == 0 and "0 runs of 0 implementations" in text
    assert page(out / "index.html").xpath("//p[@id='empty']")
    code, _, err = history(capsys, "--out", str(out))
    assert code == 2 and "--results-db" in err
    code, _, err = history(capsys, "--results-db", "mysql://x/y", "--out", str(out))
    assert code == 2 and "unknown scheme 'mysql'" in err
    (tmp_path / "file").write_text("")
    code, _, err = history(capsys, "--results-db", str(tmp_path / "empty.sqlite"), "--out", str(tmp_path / "file"))
    assert code == 2 and "cannot write" in err


def test_history_help_names_the_pages(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", "--help"]) == 0
    out = capsys.readouterr().out
    assert "runs/<RUN_ID>.html" in out and "latest.html" in out and "never rewritten" in out
    assert main(["--help"]) == 0 and "kvconform history --results-db" in " ".join(capsys.readouterr().out.split())
