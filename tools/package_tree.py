"""The static tools' view of the package: the tree a wheel installs, built as links under build/package-tree.

The design card's top-level folders are real folders that the packaging maps into ``kvconform`` (pyproject.toml,
``[tool.setuptools.package-dir]``). Python follows that mapping through the editable install's finder; mypy and
import-linter read files, not finders, so they get a tree of real folders whose files link to the checkout's,
laid out exactly as in the wheel (plus tests/, bench/ and tools/, which import it):

    python tools/package_tree.py mypy                # mypy on the package, tests, bench and tools
    python tools/package_tree.py lint-imports        # the import-linter contracts of pyproject.toml

Paths in the tools' output are the checkout's (``targets/kbtp_bed.py``, not the tree's).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "package-tree"
# Importers of the package that are not part of it: type-checked with it, under their own names.
BESIDE = ("tests", "bench", "tools")


def package_dirs() -> dict[str, str]:
    """Package name -> checkout folder, as pyproject.toml maps them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return dict(config["tool"]["setuptools"]["package-dir"])


def _tree_path(package: str) -> Path:
    return TREE.joinpath(*package.split("."))


def build() -> dict[Path, Path]:
    """(Re)build the tree; returns tree folder -> checkout folder, longest first, for mapping paths back."""
    if TREE.exists():
        shutil.rmtree(TREE)
    folders: dict[Path, Path] = {}
    for package, folder in package_dirs().items():
        source = ROOT / folder
        dest = _tree_path(package)
        folders[dest] = source
        for path in sorted(source.rglob("*")):
            rel = path.relative_to(source)
            if "__pycache__" in rel.parts or path.is_dir():
                continue
            link = dest / rel
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    for name in BESIDE:
        (TREE / name).symlink_to(ROOT / name, target_is_directory=True)
        folders[TREE / name] = ROOT / name
    return dict(sorted(folders.items(), key=lambda item: -len(str(item[0]))))


def _checkout_paths(text: str, folders: dict[Path, Path]) -> str:
    """The tools print paths relative to the tree; give them relative to the checkout."""
    for tree_dir, source in folders.items():
        rel_tree = os.path.relpath(tree_dir, TREE)
        rel_source = os.path.relpath(source, ROOT)
        text = re.sub(rf"(^|\s|\"){re.escape(rel_tree)}/", rf"\g<1>{rel_source}/", text, flags=re.M)
    return text


def _run(argv: list[str], folders: dict[Path, Path]) -> int:
    proc = subprocess.run(argv, cwd=TREE, capture_output=True, text=True, check=False)
    sys.stdout.write(_checkout_paths(proc.stdout, folders))
    sys.stderr.write(_checkout_paths(proc.stderr, folders))
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["mypy", "lint-imports", "build"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to the tool")
    args = parser.parse_args(argv)
    folders = build()
    config = str(ROOT / "pyproject.toml")
    bindir = Path(sys.executable).parent
    if args.tool == "mypy":
        # The cache stays in the checkout's .mypy_cache: the tree is rebuilt every run, its files' targets are not.
        return _run([sys.executable, "-m", "mypy", "--config-file", config, "--cache-dir", str(ROOT / ".mypy_cache"),
                     *(args.args or ["kvconform", *BESIDE])], folders)
    if args.tool == "lint-imports":
        return _run([str(bindir / "lint-imports"), config, *args.args], folders)
    print(f"package tree: {TREE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
