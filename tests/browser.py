"""Headless Chromium for the harness's page tests (Python Playwright driving Debian's ``chromium``).

``browser_page()`` yields a Playwright page of a fresh Chromium (its own ``--user-data-dir``, removed after)
started with the flags every page test uses. ``require_browser()`` skips a test where Playwright or Chromium is
missing, except in CI (``CI`` set), where .ci/run installs both and their absence is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS", "browser_page", "browser_problem", "require_browser"]

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


@contextlib.contextmanager
def browser_page() -> Iterator[Page]:
    """A page of a fresh headless Chromium; closed, and its profile removed, on exit."""
    from playwright.sync_api import sync_playwright

    executable = CHROMIUM if os.path.isfile(CHROMIUM) else shutil.which("chromium") or CHROMIUM
    with tempfile.TemporaryDirectory(prefix="kvconform-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, executable_path=executable, headless=True,
                                                        args=list(CHROMIUM_FLAGS), timeout=LAUNCH_TIMEOUT_MS)
        try:
            page = context.new_page()
            page.set_default_timeout(30_000)
            yield page
        finally:
            context.close()
