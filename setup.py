"""The package list: every folder with an ``__init__.py`` under the roots pyproject.toml's package-dir maps into
``kvconform`` (the design card's top-level folders), so a new subpackage needs no entry anywhere."""

import tomllib
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
ROOTS: dict[str, str] = tomllib.loads((HERE / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]


def packages() -> list[str]:
    found = set()
    for name, folder in ROOTS.items():
        for init in (HERE / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(HERE / folder).parts
            found.add(".".join((name, *rel)))
    return sorted(found)


setup(packages=packages())
