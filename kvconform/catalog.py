"""The requirement catalogs: ``conformance/requirements/<protocol>.yaml`` (docs/conventions.md).

Every check cites requirement ids from here; the coverage report lists every requirement per role with
its tests. Catalogs are validated against ``conformance/requirements/schema.json``; ids are unique across
all catalogs and start with the protocol name in upper case. A process parses a folder's catalogs once: a
second ``load_catalogs`` of unchanged files returns the same (read-only) Catalog, and a catalog file that passed the
schema before is neither parsed nor validated again (kvconform.doccache).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from kvconform import doccache, yamlload

__all__ = ["CATALOG_DIR_ENV", "Catalog", "CatalogError", "ProtocolCatalog", "Requirement", "load_catalogs"]

# Overrides the packaged catalogs (the harness's own tests use a temporary directory).
CATALOG_DIR_ENV = "KVCONFORM_CATALOG_DIR"
_SCHEMA_NAME = "schema.json"


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file, the field and what was expected."""


@dataclass(frozen=True)
class Requirement:
    """One normative statement of a spec text, with the stable id checks cite."""

    id: str
    protocol: str
    section: str
    level: str
    roles: tuple[str, ...]
    text: str
    quote: str | None = None
    source: str | None = None
    testable: bool = True
    why: str | None = None
    # Provisional profiles its checks rely on (declared in the catalog's `provisional` header).
    depends_on: tuple[str, ...] = ()
    file: str = ""


@dataclass(frozen=True)
class ProtocolCatalog:
    """The header of one catalog file: its protocol, roles and suite -> role mapping."""

    protocol: str
    title: str
    source: str
    roles: tuple[str, ...]
    suites: dict[str, str]
    file: str
    # Provisional profile name -> what it stands in for (requirements name them in depends_on).
    provisional: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Catalog:
    """All loaded requirement catalogs, indexed by requirement id (shared by every caller: never changed)."""

    directory: str
    protocols: dict[str, ProtocolCatalog] = field(default_factory=dict)
    _by_id: dict[str, Requirement] = field(default_factory=dict)

    def get(self, req_id: str) -> Requirement:
        """The requirement ``req_id``; KeyError naming the catalog folder when unknown."""
        try:
            return self._by_id[req_id]
        except KeyError:
            raise KeyError(f"requirement {req_id!r} is not in any catalog under {self.directory}") from None

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._by_id

    def __iter__(self) -> Iterator[Requirement]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def requirements(self, protocol: str | None = None) -> list[Requirement]:
        """Requirements in catalog order, all or those of ``protocol``."""
        return [r for r in self._by_id.values() if protocol is None or r.protocol == protocol]

    def role_of_suite(self, suite: str) -> str | None:
        """The catalog role a suite tests (``tlkv-decode`` -> ``decode-side``); None when unknown."""
        proto = suite.split("-", 1)[0]
        pc = self.protocols.get(proto)
        if pc is None:
            return None
        return pc.suites.get(suite)

    def file_for(self, protocol: str) -> str:
        """The catalog file of ``protocol`` (or the catalog folder when there is none)."""
        pc = self.protocols.get(protocol)
        if pc is not None:
            return pc.file
        return os.path.join(self.directory, f"{protocol}.yaml")


def default_catalog_dir() -> Path:
    """$KVCONFORM_CATALOG_DIR, else the installed ``kvconform.conformance.requirements`` folder."""
    env = os.environ.get(CATALOG_DIR_ENV)
    if env:
        return Path(env)
    return Path(str(resources.files("kvconform.conformance.requirements")))


def _schema() -> bytes:
    return resources.files("kvconform.conformance.requirements").joinpath(_SCHEMA_NAME).read_bytes()


@lru_cache(maxsize=4)  # compiled once per process and schema
def _validator(schema: bytes) -> Any:
    import jsonschema  # lazy: ~0.1 s of start-up that only validating a file needs

    return jsonschema.Draft202012Validator(json.loads(schema))


def _validate(doc: object, path: Path, schema: bytes) -> None:
    errors = sorted(_validator(schema).iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{path}: {e.json_path}: {e.message}" for e in errors[:20]]
        raise CatalogError("invalid requirement catalog:\n  " + "\n  ".join(lines))


def _parse(raw: bytes, path: Path) -> Any:
    try:
        return yamlload.safe_load(raw.decode("utf-8"))
    except yamlload.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from exc


def _load_file(path: Path, catalog: Catalog) -> None:
    raw = path.read_bytes()
    schema = _schema()
    doc = doccache.load("requirement catalog", [schema], raw, lambda: _parse(raw, path),
                        lambda doc: _validate(doc, path, schema))
    assert isinstance(doc, dict)
    proto: str = doc["protocol"]
    if proto in catalog.protocols:
        raise CatalogError(
            f"{path}: $.protocol: {proto!r} is already defined by {catalog.protocols[proto].file}"
        )
    roles = tuple(doc["roles"])
    for suite, role in doc["suites"].items():
        if not suite.startswith(proto + "-"):
            raise CatalogError(f"{path}: $.suites: suite {suite!r} does not start with {proto + '-'!r}")
        if role not in roles:
            raise CatalogError(f"{path}: $.suites.{suite}: role {role!r} is not one of $.roles {list(roles)}")
    provisional: dict[str, str] = dict(doc.get("provisional", {}))
    catalog.protocols[proto] = ProtocolCatalog(
        proto, doc["title"], doc["source"], roles, dict(doc["suites"]), str(path), provisional
    )
    prefix = proto.upper() + "-"
    for i, raw in enumerate(doc["requirements"]):
        rid: str = raw["id"]
        where = f"{path}: $.requirements[{i}]"
        if not rid.startswith(prefix):
            raise CatalogError(f"{where}.id: {rid!r} does not start with the protocol prefix {prefix!r}")
        if rid in catalog:
            raise CatalogError(f"{where}.id: duplicate id {rid!r}, first defined in {catalog.get(rid).file}")
        for role in raw["roles"]:
            if role not in roles:
                raise CatalogError(
                    f"{where}.roles: role {role!r} of {rid} is not one of $.roles {list(roles)}"
                )
        for name in raw.get("depends_on", []):
            if name not in provisional:
                raise CatalogError(
                    f"{where}.depends_on: {name!r} of {rid} is not declared in $.provisional {sorted(provisional)}"
                )
        catalog._by_id[rid] = Requirement(
            id=rid,
            protocol=proto,
            section=raw["section"],
            level=raw["level"],
            roles=tuple(raw["roles"]),
            text=raw["text"].strip(),
            quote=raw.get("quote"),
            source=raw.get("source"),
            testable=raw.get("testable", True),
            why=raw.get("why"),
            depends_on=tuple(raw.get("depends_on", ())),
            file=str(path),
        )


def load_catalogs(dir: str | os.PathLike[str] | None = None) -> Catalog:
    """Load and validate every ``*.yaml`` catalog in ``dir`` (default: see ``default_catalog_dir``)."""
    directory = Path(dir) if dir is not None else default_catalog_dir()
    if not directory.is_dir():
        raise CatalogError(f"catalog folder {directory} does not exist")
    files = []
    for path in sorted(directory.glob("*.yaml")):
        st = path.stat()
        files.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
    return _load_catalogs(directory, tuple(files))


# Keyed by the files' identities and stamps: an edited, added or removed catalog file is parsed again.
@lru_cache(maxsize=16)
def _load_catalogs(directory: Path, files: tuple[tuple[Path, int, int, int], ...]) -> Catalog:
    catalog = Catalog(directory=str(directory))
    for path, *_stamp in files:
        _load_file(path, catalog)
    return catalog
