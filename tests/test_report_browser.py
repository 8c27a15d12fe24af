"""The certification report as a person sees it: rendered by headless Chromium (Debian's `chromium`, driven by
Playwright with that executable; `playwright install` is never used), for a reference run and for a run against
a target that breaks a mandatory rule. What is checked is what is on the screen: the headline, the Identity
block, the failing requirement first with its whole message, and an evidence link that opens the evidence.

Without /usr/bin/chromium the tests fail under CI (.ci/run installs it) and are skipped, saying why, elsewhere
(tests/browser.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvconform.reports.identity import file_sha256
from tests.browser import Browser
from tests.browser import browser as chromium
from tests.report_runs import (
    BROKEN_REQUIREMENT,
    ReportRun,
    given_report_dirs,
    load_given,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


def _identity_on_screen(page: Any, run: ReportRun) -> None:
    """The Identity block shows what the report's JSON says, where a person looks for it."""
    ident = page.locator("#identity")
    assert ident.is_visible()
    text = ident.inner_text()
    doc = run.doc["identity"]
    bed = doc["testbed"]
    assert bed["sha256"] == file_sha256(bed["file"] if os.path.isabs(bed["file"]) else Path(doc["run"]["cwd"]) /
                                        bed["file"]), "the testbed's SHA-256 is that of the file used"
    assert bed["name"] in text and bed["sha256"] in text
    assert page.locator("#command").inner_text() == doc["run"]["command"]
    assert doc["run"]["command"].startswith("kvconform run ")
    assert str(doc["run"]["seed"]) in text and doc["harness"]["commit"] in text
    for spec in doc["specs"]:
        assert spec["catalog"]["sha256"] in text
        assert (spec["text"]["sha256"] or "not available") in text
    # Every PICS value is on the page with its origin (the roles not tested are folded, not dropped).
    rows = page.locator("tr[data-pics]")
    assert rows.count() == len(doc["pics"]["values"])
    reader = page.locator("tr[data-pics='tlkv.reader.versions']")
    assert reader.is_visible() and "[1, 2]" in reader.inner_text()


def _opens_evidence(browser: Browser, page: Any, link: Any, nodeid: str) -> Any:
    """Clicking ``link`` shows the check's evidence page: its nodeid, verdict and transcript."""
    link.click()
    page.wait_for_load_state()
    assert page.url.endswith(".html") and "/evidence/" in page.url
    heading = page.locator("h1#check").inner_text()
    assert nodeid in heading
    assert page.locator("#transcript").is_visible()
    return page


def test_reference_report_shows_identity_and_passes(browser: Browser, reference: ReportRun) -> None:
    assert reference.code == 0, reference.output
    page = browser.open(reference.report_dir / "coverage.html")
    headline = page.locator("#headline").inner_text()
    assert headline.startswith("PASSED: every mandatory requirement exercised passed"), headline
    impl = page.locator("#identity").inner_text()
    assert "kvconform reference implementations" in impl and "kvconform project" in impl
    _identity_on_screen(page, reference)
    assert "declared" in page.locator("tr[data-pics='tlkv.reader.versions']").inner_text()
    # No requirement failed, so the first requirement on the page is a row of the per-role tables.
    assert page.locator("#fail").count() == 0
    first = page.locator("[data-requirement]").first
    assert first.get_attribute("data-verdict") != "fail"
    link = page.locator("a.evidence").first
    nodeid = link.locator("xpath=..").locator(".nid").first.inner_text()
    _opens_evidence(browser, page, link, nodeid)
    assert browser.outside == [], f"the pages fetched something from outside: {browser.outside}"


def test_broken_target_report_shows_the_failing_requirement_first(browser: Browser, broken: ReportRun) -> None:
    assert broken.code == 1, broken.output
    page = browser.open(broken.report_dir / "coverage.html")
    headline = page.locator("#headline").inner_text()
    assert headline.startswith("FAILED: 1 mandatory requirement failed"), headline
    _identity_on_screen(page, broken)
    ident = page.locator("#identity").inner_text()
    assert "not declared" in ident, "an ad-hoc python: target declares no implementation, and the page says so"
    assert "defaulted" in page.locator("tr[data-pics='tlkv.reader.versions']").inner_text()
    # The first requirement on the page is the one the target breaks, above the per-role tables.
    first = page.locator("[data-requirement]").first
    assert (first.get_attribute("data-requirement"), first.get_attribute("data-verdict")) == (BROKEN_REQUIREMENT,
                                                                                               "fail")
    assert first.is_visible()
    tables, box = page.locator("#requirements").bounding_box(), first.bounding_box()
    assert tables is not None and box is not None, "the failure or the tables are not laid out"
    assert box["y"] < tables["y"], "failures come before the per-role tables"
    text = first.inner_text()
    assert "RULE (mandatory)" in text
    assert "the reader accepted it: seen 'ok', expected a refusal (format)" in text, "the whole message"
    assert "field" in text and "seen" in text and "expected" in text
    # Its evidence link opens the evidence: the failing check, the broken requirement, what was sent, as bytes.
    check = first.locator("div.check").filter(has_text="test_rule[crc-field-v1]")
    nodeid = check.locator(".nid").first.inner_text()
    evidence = _opens_evidence(browser, page, check.locator("a.evidence").first, nodeid)
    body = evidence.locator("body").inner_text()
    assert "requirement broken" in body and BROKEN_REQUIREMENT in body
    assert "seen 'ok', expected a refusal (format)" in evidence.locator("#message").inner_text()
    sent = evidence.locator("tr.sent").first.inner_text()
    assert "→ sent to the target" in sent and "envelope" in sent
    assert "00000000  54 4c 4b 56" in sent, "the bytes sent, as a hex dump from the TLKV magic"
    assert "← received from the target" in evidence.locator("tr.received").first.inner_text()
    assert "import-outcome" in body and "status" in body
    evidence.go_back()
    assert browser.outside == [], f"the pages fetched something from outside: {browser.outside}"


@pytest.mark.parametrize("report_dir", given_report_dirs() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no report folder given ($KVCONFORM_CHECK_REPORT_DIRS); .ci/run gives the main job's"))])
def test_given_report_in_browser(browser: Browser, report_dir: Path) -> None:
    """A report another run wrote (CI: the main job's `kvconform run all`), as a person sees it."""
    run = load_given(report_dir)
    page = browser.open(report_dir / "coverage.html")
    headline = page.locator("#headline").inner_text()
    status = run.doc["verdict"]["status"]
    assert headline.startswith(status + ": ") and headline == run.doc["verdict"]["text"]
    assert (status == "PASSED") == (run.code == 0), f"exit {run.code} under the headline {headline!r}"
    _identity_on_screen(page, run)
    first = page.locator("[data-requirement]").first
    if run.doc["verdict"]["failed"]:
        assert first.get_attribute("data-verdict") == "fail"
    # Every evidence link on the page points at a file of the report folder.
    hrefs = page.eval_on_selector_all("a.evidence, a.evidence-json", "els => els.map(e => e.href)")
    assert hrefs, "the page links no evidence"
    missing = [h for h in hrefs if not Path(h.removeprefix("file://")).is_file()]
    assert not missing, f"{len(missing)} evidence links lead nowhere, e.g. {missing[:3]}"
    link = page.locator("a.evidence").first
    _opens_evidence(browser, page, link, link.locator("xpath=..").locator(".nid").first.inner_text())
    assert browser.outside == [], f"the pages fetched something from outside: {browser.outside}"
