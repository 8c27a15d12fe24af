"""One import name per module: the design card's top-level folders are real folders that pyproject.toml's package-dir
maps into ``kvconform``, and nothing loads one of their files under a second name (``conformance.kbtp.bed`` beside
``kvconform.targets.kbtp_bed``)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
    "package-dir"]

# Imports every module of the package by its one name, then collects every suite as `kvconform run` does, and
# prints each checkout file that more than one module name loaded, and any mapped folder imported top-level.
_PROBE = r"""
import collections, importlib, json, os, sys, tomllib
from pathlib import Path

root, report_dir = Path(sys.argv[1]), sys.argv[2]
dirs = tomllib.loads((root / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
failed = {}
for package, folder in dirs.items():
    for path in sorted((root / folder).rglob("*.py")):
        if not (path.parent / "__init__.py").is_file() or path.name == "__main__.py":
            continue
        parts = path.relative_to(root / folder).with_suffix("").parts
        name = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = repr(exc)
from kvconform import cli
collected = cli.main(["run", "all", "-k", "no_check_has_this_name", "--report-dir", report_dir, "-q"])
ours = [(root / f).resolve() for f in dirs.values()]
names = collections.defaultdict(set)
for name, module in list(sys.modules.items()):
    file = getattr(module, "__file__", None)
    if file and any(Path(file).resolve().is_relative_to(folder) for folder in ours):
        names[str(Path(file).resolve().relative_to(root))].add(name)
top = sorted(n for n in sys.modules if n.split(".")[0] in {f.split("/")[0] for f in dirs.values()} - {"kvconform"})
print(json.dumps({"failed": failed, "twice": {f: sorted(n) for f, n in names.items() if len(n) > 1},
                  "top_level": top, "loaded": len(names), "run_status": collected}))
"""


def _package_folders() -> dict[str, Path]:
    """Every package (a folder with an __init__.py) under the mapped roots -> its folder."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found[".".join((package, *init.parent.relative_to(ROOT / folder).parts))] = init.parent
    return found


def test_no_mapped_folder_is_a_link() -> None:
    for package, folder in PACKAGE_DIRS.items():
        assert not (ROOT / folder).is_symlink(), f"{folder} (package {package}) must be a real folder"
    links = [str(p.relative_to(ROOT)) for p in (ROOT / "kvconform").rglob("*") if p.is_symlink()]
    assert links == [], f"links inside kvconform/ give a second name to what they point at: {links}"


def test_every_package_resolves_to_its_folder() -> None:
    """What the editable install and the wheel map each package to: the folder pyproject.toml names."""
    for name, folder in sorted(_package_folders().items()):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations is not None, f"{name} is not importable"
        located = {Path(p).resolve() for p in spec.submodule_search_locations}
        assert located == {folder.resolve()}, f"{name} resolves to {sorted(located)}, expected {folder}"


def test_every_module_loads_under_one_name(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT), str(tmp_path / "report")], capture_output=True,
                          text=True, timeout=240, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}, f"modules that do not import by their one name: {result['failed']}"
    assert result["twice"] == {}, f"files loaded under two names: {result['twice']}"
    assert result["top_level"] == [], f"mapped folders imported as top-level packages: {result['top_level']}"
    assert result["loaded"] > 250, f"the probe loaded only {result['loaded']} checkout files"


def test_this_session_loads_no_file_twice() -> None:
    """The harness's own test session (pytest's importlib mode over tests/) keeps the same rule."""
    ours = [(ROOT / f).resolve() for f in [*PACKAGE_DIRS.values(), "tests"]]
    names: dict[Path, set[str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and any(Path(file).resolve().is_relative_to(folder) for folder in ours):
            names.setdefault(Path(file).resolve(), set()).add(name)
    twice = {str(f.relative_to(ROOT)): sorted(n) for f, n in names.items() if len(n) > 1}
    assert twice == {}, f"files loaded under two names: {twice}"


def _function_imports() -> list[tuple[str, int, str, bool]]:
    """(file, line, module, has a reason) of every import statement inside a function of the package."""
    found = []
    for folder in PACKAGE_DIRS.values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = path.read_text("utf-8").splitlines()
            tree = ast.parse("\n".join(lines))
            for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
                for node in ast.walk(func):
                    if not isinstance(node, ast.Import | ast.ImportFrom):
                        continue
                    if isinstance(node, ast.ImportFrom) and node.level:
                        continue
                    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    # the reason sits on the statement or on another line of its block of imports
                    first, last = node.lineno - 1, node.end_lineno or node.lineno
                    while first > 0 and _IMPORT.match(lines[first - 1]):
                        first -= 1
                    while last < len(lines) and _IMPORT.match(lines[last]):
                        last += 1
                    reason = any(_REASON.search(line) for line in lines[first:last])
                    found.append((str(path.relative_to(ROOT)), node.lineno, module or "", reason))
    return found


_IMPORT = re.compile(r"^\s*(from \S+ )?import ")
_REASON = re.compile(r"#.*\b(optional|lazy): \S")


def test_imports_inside_functions_are_optional_or_lazy_and_say_why() -> None:
    """kvconform's own modules are imported at the top, where a reader (and import-linter) sees a module's
    dependencies; inside a function only an optional dependency or a heavy one a start-up does not need, each
    with its reason (``# optional: ...`` or ``# lazy: ...``) on its block of imports."""
    imports = list(dict.fromkeys(_function_imports()))  # nested functions are walked twice
    own = [f"{f}:{line} imports {m}" for f, line, m, _ in imports if m.split(".")[0] == "kvconform"]
    assert own == [], "kvconform modules imported inside functions:\n" + "\n".join(own)
    silent = [f"{f}:{line} imports {m}" for f, line, m, reason in imports if not reason]
    assert silent == [], "imports inside functions without '# optional: why' or '# lazy: why':\n" + "\n".join(silent)
