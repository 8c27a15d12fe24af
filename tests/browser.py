"""Headless Chromium for the harness's page tests (Python Playwright driving Debian's ``chromium``).

``browser()`` yields a Browser (a fresh Chromium, its own ``--user-data-dir`` removed after, started with the
flags every page test uses) whose pages load nothing but file: URLs; ``browser_page()`` one page of it.
``require_browser()`` skips a test where Playwright or Chromium is missing, except in CI (``CI`` set), where
.ci/run installs both and their absence is a failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Page, Route

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS", "Browser", "browser", "browser_page", "browser_problem", "require_browser"]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run")
LAUNCH_TIMEOUT_MS = 60_000


def browser_problem() -> str | None:
    """Why no page test can run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"Python Playwright is not installed ({exc}); the test extra has it"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and shutil.which("chromium") is None:
        return f"{CHROMIUM} is missing (Debian package chromium; .ci/run installs it)"
    return None


def require_browser() -> None:
    problem = browser_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the page tests: {problem}")
    pytest.skip(problem)


class Browser:
    """A fresh Chromium context whose pages may load file: URLs only; what else they asked for is kept."""

    def __init__(self, context: BrowserContext) -> None:
        self.context = context
        self.outside: list[str] = []  # a self-contained page asks for nothing: a test asserts this stays empty
        context.set_default_timeout(30_000)
        context.route(re.compile(r"^(?!file:).*"), self._refuse)

    def _refuse(self, route: Route) -> None:
        self.outside.append(route.request.url)
        route.abort()

    def open(self, path: Path) -> Page:
        page = self.context.new_page()
        page.goto(path.resolve().as_uri())
        return page


@contextlib.contextmanager
def browser() -> Iterator[Browser]:
    """A fresh headless Chromium (its own profile, removed on exit) as a Browser."""
    require_browser()
    from playwright.sync_api import sync_playwright

    executable = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium") or CHROMIUM
    with tempfile.TemporaryDirectory(prefix="kvconform-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=executable, headless=True,
                                                        args=list(CHROMIUM_FLAGS), timeout=LAUNCH_TIMEOUT_MS)
        try:
            yield Browser(context)
        finally:
            context.close()


@contextlib.contextmanager
def browser_page() -> Iterator[Page]:
    """A page of a fresh headless Chromium; closed, and its profile removed, on exit."""
    with browser() as b:
        yield b.context.new_page()
