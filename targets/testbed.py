"""Testbed files: the targets a run can name and the PICS each declares.

A testbed is validated against ``testbeds/schema/testbed.schema.json``; the PICS of each protocol are
checked by ``testbeds/schema/pics-<proto>.schema.json`` when that file exists (any object otherwise), so a
protocol lane adds its PICS schema without touching the testbed schema's code.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvconform import doccache, yamlload

__all__ = ["Testbed", "TestbedError", "default_testbed_path", "load_testbed", "schema_dir", "validate_pics"]

_SCHEMA_FILE = "testbed.schema.json"
# Any object: the PICS of a protocol whose lane has not written its schema yet.
_ANY_OBJECT: dict[str, Any] = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}


class TestbedError(ValueError):
    """A testbed file is malformed; the message names the file, the JSON path and what was expected."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class Testbed:
    """A loaded, validated testbed."""

    __test__ = False

    name: str
    path: str
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def default_pics(self) -> dict[str, Any]:
        """PICS for ad-hoc targets (URL, cmd:, python:)."""
        pics: dict[str, Any] = self.defaults.get("pics", {})
        return pics


def schema_dir() -> Path:
    """The installed ``testbeds/schema`` folder."""
    return Path(str(resources.files("kvconform.testbeds"))) / "schema"


def default_testbed_path() -> Path:
    """The packaged ``testbeds/loopback.yaml``."""
    return Path(str(resources.files("kvconform.testbeds"))) / "loopback.yaml"


def _schemas() -> tuple[Path, tuple[tuple[str, bytes], ...]]:
    """The schema folder and its files' names and bytes: what the validator reads, and what it is known by."""
    folder = schema_dir()
    return folder, tuple((f.name, f.read_bytes()) for f in sorted(folder.glob("*.json")))


@lru_cache(maxsize=4)  # compiled once per process and schema folder content: every testbed and --pics-set reuses it
def _validator(folder: Path, schemas: tuple[tuple[str, bytes], ...]) -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs
    from referencing import Registry, Resource  # lazy: with jsonschema
    from referencing.jsonschema import DRAFT202012

    files = dict(schemas)
    schema = json.loads(files[_SCHEMA_FILE])

    def retrieve(uri: str) -> Resource[Any]:
        # Only sibling files are resolved, never the network.
        name = uri.rsplit("/", 1)[-1]
        if name.startswith("pics-") and name not in files:
            return Resource.from_contents(_ANY_OBJECT, default_specification=DRAFT202012)
        if name not in files:
            raise LookupError(f"schema {uri} not found as {folder / name}")
        return Resource.from_contents(json.loads(files[name]), default_specification=DRAFT202012)

    registry: Registry[Any] = Registry(retrieve=retrieve)  # type: ignore[call-arg]
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_pics(pics: object, where: str) -> None:
    """Raise TestbedError naming the PICS path of every schema violation of ``pics`` (e.g. after --pics-set)."""
    doc = {"name": "pics", "targets": {"t": {"driver": "reference", "pics": pics}}}
    errors = sorted(_validator(*_schemas()).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        def at(e: Any) -> str:
            path = ".".join(str(p) for p in list(e.absolute_path)[3:])
            return path or "(top)"
        raise TestbedError("; ".join(f"{where}: PICS {at(e)}: {e.message}" for e in errors[:5]))


def load_testbed(path: str | os.PathLike[str] | None = None) -> Testbed:
    """Load and validate a testbed YAML file (default: the packaged loopback testbed); a process parses and
    validates a file once (until it changes), each call gets its own copy."""
    file = Path(path) if path is not None else default_testbed_path()
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise TestbedError(f"{file}: cannot read testbed: {exc.strerror}") from exc
    doc = copy.deepcopy(_validated(file, raw, *_schemas()))
    return Testbed(
        name=doc["name"],
        path=str(file),
        description=doc.get("description", ""),
        defaults=doc.get("defaults", {}),
        targets=doc.get("targets", {}),
    )


@lru_cache(maxsize=16)
def _validated(file: Path, raw: bytes, folder: Path, schemas: tuple[tuple[str, bytes], ...]) -> dict[str, Any]:
    """The document of a testbed file's bytes, parsed and validated (once per content: kvconform.doccache)."""
    doc = doccache.load("testbed", (b for _, b in schemas), raw, lambda: _parse(raw, file),
                        lambda doc: _validate(doc, file, folder, schemas))
    assert isinstance(doc, dict)
    return doc


def _parse(raw: bytes, file: Path) -> Any:
    try:
        return yamlload.safe_load(raw.decode("utf-8"))
    except yamlload.YAMLError as exc:
        raise TestbedError(f"{file}: not valid YAML: {exc}") from exc


def _validate(doc: object, path: Path, folder: Path, schemas: tuple[tuple[str, bytes], ...]) -> None:
    errors = sorted(_validator(folder, schemas).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{path}: {e.json_path}: {e.message}" for e in errors[:20]]
        raise TestbedError("invalid testbed:\n  " + "\n  ".join(lines))
