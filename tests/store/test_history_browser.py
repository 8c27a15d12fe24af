"""The history pages as a person sees them, in headless Chromium (tests/browser.py: Debian's chromium through
Playwright): every link from the index leads to a page that exists and renders, the requirement × run table is
laid out with each verdict change outlined, and latest.html shows the newest run and leads to its history.
Without Chromium the test is skipped, saying why (failed under CI, which installs it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from kvconform.cli import main
from kvconform.store import open_store
from tests.browser import Browser
from tests.browser import browser as chromium
from tests.store.synthetic import history_runs


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def pages(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as store:
        for run in history_runs(more=True):
            store.record(run)
    out = tmp_path / "history"
    assert main(["history", "--results-db", url, "--out", str(out)]) == 0
    return out


def _file(href: str) -> Path:
    parts = urlsplit(href)
    assert parts.scheme == "file", f"a link out of the folder: {href}"
    return Path(unquote(parts.path))


def test_every_page_is_reachable_and_renders(browser: Browser, pages: Path) -> None:
    seen: set[Path] = set()
    todo = [pages / "index.html"]
    page = browser.context.new_page()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        page.goto(path.as_uri())
        heading = page.locator("h1").first
        assert heading.is_visible() and heading.inner_text(), f"{path}: no heading on the screen"
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        for href in hrefs:
            target = _file(href)
            assert target.is_file(), f"{path.relative_to(pages)}: the link {href} leads nowhere"
            todo.append(target)
    written = set(pages.rglob("*.html"))
    assert seen == written, (f"pages no link leads to: {sorted(str(p) for p in written - seen)}; "
                             f"pages reached that are not .html: {sorted(str(p) for p in seen - written)}")
    assert browser.outside == [], f"the pages fetched something from outside: {browser.outside}"


def test_the_table_shows_each_change_and_latest_leads_to_its_history(browser: Browser, pages: Path) -> None:
    page = browser.open(pages / "latest.html")
    assert page.locator("h1#run").inner_text().startswith("Latest run (#5): impl 1")
    page.locator("nav a.identity").click()
    page.wait_for_load_state()
    assert page.url.endswith(".html") and "/identity-" in page.url
    table = page.locator("table#timeline")
    assert table.is_visible()
    box = table.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 50, "the table is not laid out"
    row = page.locator("tr[data-row='X-ONE'] td")
    assert row.count() == 4
    outlines = [row.nth(i).evaluate("td => getComputedStyle(td).outlineStyle") for i in range(4)]
    assert outlines == ["none", "solid", "solid", "solid"], "every verdict change of X-ONE outlined, no other cell"
    assert [row.nth(i).inner_text() for i in range(4)] == ["pass", "fail", "pass", "fail"]
    first = page.locator("table#timeline tbody tr").first
    assert first.get_attribute("data-row") == "X-ONE", "a row that changed comes first"
    flaky = page.locator("#flaky tr[data-flaky='t::a']")
    assert flaky.is_visible() and "#2" in flaky.inner_text()
    # a run's link in the table's head opens that run's permanent page
    page.locator("table#timeline thead a", has_text="#2").click()
    page.wait_for_load_state()
    assert page.url.endswith("/runs/2.html")
    assert page.locator("tr[data-check='t::a']").get_attribute("data-verdict") == "fail"
    assert browser.outside == [], f"the pages fetched something from outside: {browser.outside}"
