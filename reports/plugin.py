"""The report writers' pytest entry (``pytest11`` entry point ``kvconform-reports``): light, like the plugin it
serves (fixtures/plugin.py). When a session becomes a kvconform one it registers the writers
(kvconform.reports.session: coverage, certification, HTML, JUnit, Allure, evidence pages, the manifest, the console
summary); an unrelated pytest session imports nothing more than this module."""

from __future__ import annotations

import pytest

__all__ = ["WRITERS_PLUGIN"]

WRITERS_PLUGIN = "kvconform.reports.session"


@pytest.hookimpl(optionalhook=True)
def pytest_kvconform_activate(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(WRITERS_PLUGIN):
        config.pluginmanager.import_plugin(WRITERS_PLUGIN)
