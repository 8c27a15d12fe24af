"""Testbed files: the targets a run can name and the PICS each declares.

A testbed is validated against ``testbeds/schema/testbed.schema.json``; the PICS of each protocol are
checked by ``testbeds/schema/pics-<proto>.schema.json`` when that file exists (any object otherwise), so a
protocol lane adds its PICS schema without touching the testbed schema's code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

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


def _validator() -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs
    from referencing import Registry, Resource  # lazy: with jsonschema
    from referencing.jsonschema import DRAFT202012

    folder = schema_dir()
    schema = json.loads((folder / _SCHEMA_FILE).read_text("utf-8"))

    def retrieve(uri: str) -> Resource[Any]:
        # Only sibling files are resolved, never the network.
        local = folder / uri.rsplit("/", 1)[-1]
        if local.name.startswith("pics-") and not local.is_file():
            return Resource.from_contents(_ANY_OBJECT, default_specification=DRAFT202012)
        if not local.is_file():
            raise LookupError(f"schema {uri} not found as {local}")
        return Resource.from_contents(json.loads(local.read_text("utf-8")), default_specification=DRAFT202012)

    registry: Registry[Any] = Registry(retrieve=retrieve)  # type: ignore[call-arg]
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_testbed(doc: object, path: str | os.PathLike[str]) -> None:
    """Raise TestbedError listing every schema violation of ``doc`` (loaded from ``path``)."""
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{path}: {e.json_path}: {e.message}" for e in errors[:20]]
        raise TestbedError("invalid testbed:\n  " + "\n  ".join(lines))


def validate_pics(pics: object, where: str) -> None:
    """Raise TestbedError naming the PICS path of every schema violation of ``pics`` (e.g. after --pics-set)."""
    doc = {"name": "pics", "targets": {"t": {"driver": "reference", "pics": pics}}}
    errors = sorted(_validator().iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        def at(e: Any) -> str:
            path = ".".join(str(p) for p in list(e.absolute_path)[3:])
            return path or "(top)"
        raise TestbedError("; ".join(f"{where}: PICS {at(e)}: {e.message}" for e in errors[:5]))


def load_testbed(path: str | os.PathLike[str] | None = None) -> Testbed:
    """Load and validate a testbed YAML file (default: the packaged loopback testbed)."""
    file = Path(path) if path is not None else default_testbed_path()
    try:
        text = file.read_text("utf-8")
    except OSError as exc:
        raise TestbedError(f"{file}: cannot read testbed: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TestbedError(f"{file}: not valid YAML: {exc}") from exc
    validate_testbed(doc, file)
    assert isinstance(doc, dict)
    return Testbed(
        name=doc["name"],
        path=str(file),
        description=doc.get("description", ""),
        defaults=doc.get("defaults", {}),
        targets=doc.get("targets", {}),
    )
