"""What the matrix tests share: registries written on the fly, running ``kvconform matrix``, reading its result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from kvconform import yamlload
from kvconform.matrix.registry import default_registry_path
from tests.spawn import kvconform

REPO = Path(__file__).resolve().parents[2]
SHIPPED = default_registry_path()


def shipped(*drop: str) -> dict[str, Any]:
    """The shipped registry's document, without the implementations named in ``drop``."""
    doc: dict[str, Any] = yamlload.safe_load(SHIPPED.read_text("utf-8"))
    for name in drop:
        del doc["implementations"][name]
    return doc


def write_registry(folder: Path, doc: dict[str, Any], name: str = "registry.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False), "utf-8")
    return path


MATRIX_BOUND = 600.0  # seconds a `kvconform matrix` may take (the default of run_matrix)


def run_matrix(registry: Path, out: Path, *args: str, timeout: float = MATRIX_BOUND) -> tuple[int, dict[str, Any], str]:
    """``kvconform matrix --registry REGISTRY --out OUT ARGS`` from the checkout; (exit status, matrix.json, output).
    Killed past ``timeout``, which the calling test's pytest-timeout must cover (tests/spawn.py)."""
    proc = kvconform(["matrix", "--registry", str(registry), "--out", str(out), *args], timeout=timeout)
    output = proc.stdout + proc.stderr
    result = out / "matrix.json"
    assert result.is_file(), f"kvconform matrix wrote no matrix.json (exit {proc.returncode}):\n{output[-4000:]}"
    return proc.returncode, json.loads(result.read_text("utf-8")), output


def cells(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in doc["cells"]}


def blamed(cell: dict[str, Any]) -> set[tuple[str, str]]:
    """(implementation, role) of every decided blame of a cell."""
    return {(b["implementation"], b["role"]) for b in cell["blame"] if not b.get("undetermined")}


def validate(doc: dict[str, Any]) -> None:
    """matrix.json against its published schema."""
    import jsonschema  # type: ignore[import-untyped]

    from kvconform.reports.matrix import schema

    jsonschema.Draft202012Validator(schema()).validate(doc)


def containers_of_run(run_id: str) -> list[str]:
    """Names of the containers (running or not) labelled with a matrix run's id."""
    from kvconform.matrix.participants import RUN_LABEL
    from kvconform.targets import docker as dk

    client = dk.docker_client(timeout_s=30.0)
    try:
        return [str(c.name) for c in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})]
    finally:
        client.close()
