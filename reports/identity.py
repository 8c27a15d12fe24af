"""The certification report's Identity block: what was tested, with what, how, when and where.

The implementation under test comes from the testbed entry's ``implementation:`` mapping (an ad-hoc target has
none, and the report says so); the PICS are listed as values, each marked when it was taken from the testbed's
defaults or set by ``--pics-set``; every catalog and the spec text its header names (``source:``) are identified
by SHA-256. Spec texts live beside a checkout (``../shared/spec/...``), not in the package: they are looked for
from the catalog's folder and the working folder upwards, and reported "not available" when absent.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import kvconform
from kvconform import __version__
from kvconform.catalog import Catalog
from kvconform.targets.spec import TargetSpec, leaf_paths
from kvconform.targets.testbed import Testbed

__all__ = ["SPEC_DIR_ENV", "build_identity", "file_sha256", "find_spec_text", "harness_commit", "pics_values",
           "replay_command"]

SPEC_DIR_ENV = "KVCONFORM_SPEC_DIR"  # a folder holding the spec texts as catalogs name them (spec/seeds/...)
UNKNOWN = "unknown"
_GIT_TIMEOUT = 5.0


def file_sha256(path: str | os.PathLike[str]) -> str | None:
    """SHA-256 of a file's bytes; None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _ancestors(path: Path) -> list[Path]:
    path = path.resolve()
    return [path, *path.parents]


def find_spec_text(source: str, catalog_file: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None,
                   ) -> Path | None:
    """The file a catalog's ``source:`` names (``spec/seeds/002_....txt``), looked for under $KVCONFORM_SPEC_DIR,
    then in every folder above the catalog and above ``cwd``, directly and under ``shared/`` (a checkout has the
    texts in ``../shared/spec/``); None when none exists (an installed package ships no spec texts)."""
    rel = Path(source)
    if rel.is_absolute():
        return rel if rel.is_file() else None
    candidates: list[Path] = []
    env = os.environ.get(SPEC_DIR_ENV)
    if env:
        candidates += [Path(env) / rel, Path(env) / rel.name, Path(env).parent / rel]
    starts = [Path(catalog_file).parent, Path(cwd) if cwd is not None else Path.cwd()]
    for start in starts:
        for folder in _ancestors(start):
            candidates += [folder / rel, folder / "shared" / rel]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return None


def harness_commit(root: Path | None = None) -> str:
    """The git commit kvconform runs from (``<sha>`` or ``<sha>+dirty``) when it runs from a checkout; "unknown"
    for an installed package, or when git is absent or slow."""
    if root is None:

        root = Path(kvconform.__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return UNKNOWN
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=_GIT_TIMEOUT, stdin=subprocess.DEVNULL)
        lines = top.stdout.splitlines()
        if top.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != root.resolve():
            return UNKNOWN
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=_GIT_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    dirty = status.returncode == 0 and bool(status.stdout.strip())
    return lines[1] + ("+dirty" if dirty else "")


def _overridden(path: str, overrides: Iterable[str]) -> bool:
    keys = [o.partition("=")[0] for o in overrides]
    return any(path == k or path.startswith(k + ".") for k in keys)


def pics_values(target: TargetSpec) -> list[dict[str, Any]]:
    """Every PICS value of the target by dotted path, marked ``defaulted`` (from the testbed's defaults, not
    declared for this target) and ``overridden`` (set by --pics-set)."""
    defaulted = set(target.defaulted)
    out: list[dict[str, Any]] = []
    for path in leaf_paths(target.pics):
        node: Any = target.pics
        for part in path.split("."):
            node = node[part]
        out.append({"path": path, "value": node, "defaulted": path in defaulted,
                    "overridden": _overridden(path, target.overrides)})
    return out


def replay_command(command: str | None, argv: Sequence[str]) -> dict[str, Any]:
    """The command to give a person: the ``kvconform ...`` line ``kvconform run`` recorded, else pytest's own."""
    if command:
        return {"command": command, "replayable": True}
    return {"command": shlex.join(["pytest", *argv]), "replayable": False}


def _specs(catalog: Catalog, protocols: Iterable[str], cwd: str | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for proto in sorted(protocols):
        pc = catalog.protocols.get(proto)
        if pc is None:
            continue
        found = find_spec_text(pc.source, pc.file, cwd)
        text: dict[str, Any] = {"name": pc.source, "available": found is not None,
                                "path": str(found) if found else None,
                                "sha256": file_sha256(found) if found else None}
        if found is None:
            text["note"] = ("not available: the spec texts are not part of an installed package; set "
                            f"${SPEC_DIR_ENV} to the folder holding {pc.source}")
        out.append({"protocol": proto, "title": pc.title,
                    "catalog": {"name": Path(pc.file).name, "path": pc.file, "sha256": file_sha256(pc.file)},
                    "text": text})
    return out


def _implementation(target: TargetSpec) -> dict[str, Any]:
    if target.implementation:
        return {"declared": True, **target.implementation}
    return {"declared": False,
            "note": f"not declared: {target.kind} target {target.name!r} names no testbed entry; declare the "
                    "implementation under test as a testbed target with an implementation: mapping"}


def build_identity(*, target: TargetSpec, testbed: Testbed, catalog: Catalog, protocols: Iterable[str],
                   suites: Iterable[str], command: str | None, argv: Sequence[str], cwd: str, seed: int,
                   strict: bool, sweep: str, started: str, finished: str, exit_code: int | None,
                   versions: Mapping[str, str]) -> dict[str, Any]:
    """The Identity block of the certification report (coverage.json ``identity``)."""

    values = pics_values(target)
    return {
        "implementation": _implementation(target),
        "target": {"name": target.name, "kind": target.kind, "value": target.value,
                   "roles": sorted(target.roles) if target.roles is not None else None},
        "testbed": {"name": testbed.name, "file": testbed.path, "sha256": file_sha256(testbed.path)},
        "pics": {"source": target.source, "overrides": list(target.overrides), "values": values,
                 "defaulted": sum(1 for v in values if v["defaulted"])},
        "specs": _specs(catalog, protocols, cwd),
        "harness": {"name": "kvconform", "version": versions.get("kvconform", __version__),
                    "commit": harness_commit(), "versions": dict(versions)},
        "run": {**replay_command(command, argv), "cwd": cwd, "suites": sorted(suites), "seed": seed,
                "strict": strict, "sweep": sweep, "started": started, "finished": finished, "exit_code": exit_code},
        "host": {"name": platform.node() or UNKNOWN, "platform": platform.platform(),
                 "python": platform.python_version(), "cpus": os.cpu_count()},
    }
