"""The matrix's tables and their cells: every compatible combination of the registered implementations.

| table kind | rows | columns | one table per | the exchange |
| --- | --- | --- | --- | --- |
| ``kvcs`` | publishers | consumers | relay | ``kvconform.matrix.kvcs`` |
| ``tlkv-transfer`` | prefill sides | decode sides | - | ``kvconform.matrix.tlkv.run_transfer`` |
| ``tlkv-envelope`` | writers | readers | - | ``kvconform.matrix.tlkv.run_envelope`` |
| ``kbtp`` | initiators | targets | - | ``kvconform.matrix.kbtp`` |

A combination is a cell only when its participants share a version (KVCS: an MOQT draft; TLKV: an envelope
version; KBTP: a binding) that kvconform can drive; otherwise its slot says why it is not a cell.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvconform.matrix.registry import MATRIX_ROLES, Registry, RoleEntry
from kvconform.rdma import PROFILES

__all__ = ["KINDS", "CellPlan", "Kind", "Plan", "Table", "cell_id", "make_plan", "selected_suites"]


@dataclass(frozen=True)
class Kind:
    """A kind of table: the role of its rows, of its columns, and the roles fixed per table."""

    name: str
    protocol: str
    title: str
    rows: str
    columns: str
    fixed: tuple[str, ...] = ()

    @property
    def suites(self) -> tuple[str, ...]:
        return (self.rows, *self.fixed, self.columns)


def _drivable(protocol: str) -> set[Any]:
    if protocol == "kvcs":
        return {22}  # kvconform's MOQT stack speaks draft 22
    if protocol == "tlkv":
        return {1, 2}
    return set(PROFILES)


KINDS: tuple[Kind, ...] = (
    Kind("kvcs", "kvcs", "KVCS: publisher -> relay -> consumer", "kvcs-publisher", "kvcs-consumer", ("kvcs-relay",)),
    Kind("tlkv-transfer", "tlkv", "TLKV tl.kv.v1 transfer: prefill side -> decode side", "tlkv-prefill",
         "tlkv-decode"),
    Kind("tlkv-envelope", "tlkv", "TLKV export envelope: writer -> reader", "tlkv-writer", "tlkv-reader"),
    Kind("kbtp", "kbtp", "KBTP: initiator -> target", "kbtp-initiator", "kbtp-target"),
)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def cell_id(kind: str, participants: dict[str, str]) -> str:
    """A cell's id from its kind and who plays each role (stable, usable as a folder name)."""
    spec = next(k for k in KINDS if k.name == kind)
    return "--".join([kind, *(_slug(participants[s]) for s in spec.suites)])


@dataclass(frozen=True)
class CellPlan:
    """One cell to run: its kind, table and participants (suite -> role entry); ``version`` the one they share."""

    id: str
    kind: str
    table: str | None  # None: an isolation cell, run only to judge a failed one
    participants: dict[str, RoleEntry]
    versions: tuple[Any, ...]

    def who(self) -> dict[str, str]:
        return {suite: e.implementation for suite, e in self.participants.items()}


@dataclass
class Table:
    """One table of the page: rows x columns of one kind (with the fixed roles' implementations)."""

    id: str
    kind: Kind
    fixed: dict[str, str]
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], str] = field(default_factory=dict)  # (row, column) -> cell id
    not_cells: dict[tuple[str, str], str] = field(default_factory=dict)  # (row, column) -> why not

    @property
    def title(self) -> str:
        return self.kind.title + "".join(f", {s.split('-', 1)[1]} {n}" for s, n in self.fixed.items())


@dataclass
class Plan:
    tables: list[Table]
    cells: dict[str, CellPlan]
    skipped_kinds: dict[str, str]  # table kind -> why it has no table (a role nobody plays, not selected)


def selected_suites(tokens: Iterable[str] | None) -> set[str]:
    """``--roles`` tokens (a protocol like ``kvcs`` or a suite like ``tlkv-decode``) -> the matrix suites."""
    every = {f"{p}-{r}" for p, roles in MATRIX_ROLES.items() for r in roles}
    if tokens is None:
        return every
    chosen: set[str] = set()
    for token in tokens:
        if token in MATRIX_ROLES:
            chosen |= {s for s in every if s.startswith(token + "-")}
        elif token in every:
            chosen.add(token)
        else:
            raise ValueError(f"--roles {token!r}: expected a protocol ({', '.join(MATRIX_ROLES)}) or a role's suite "
                             f"({', '.join(sorted(every))})")
    return chosen


def _common(kind: Kind, entries: list[RoleEntry]) -> tuple[tuple[Any, ...], str | None]:
    shared = set(entries[0].versions)
    for e in entries[1:]:
        shared &= set(e.versions)
    usable = tuple(sorted(shared & _drivable(kind.protocol), key=str))
    if usable:
        return usable, None
    listed = ", ".join(f"{e.suite.split('-', 1)[1]} {e.implementation} {list(e.versions)}" for e in entries)
    if shared:
        return (), f"not a cell: they share only {sorted(shared, key=str)}, which kvconform cannot drive ({listed})"
    return (), f"not a cell: no version in common ({listed})"


def combination(registry: Registry, kind: Kind, who: dict[str, str], table: str | None) -> tuple[CellPlan | None,
                                                                                                 str | None]:
    """The cell of ``who`` (suite -> implementation), or None and why it is not one."""
    entries = [registry.implementations[who[s]].roles[s] for s in kind.suites]
    versions, why = _common(kind, entries)
    if why is not None:
        return None, why
    cid = cell_id(kind.name, who)
    return CellPlan(cid, kind.name, table, {e.suite: e for e in entries}, versions), None


def make_plan(registry: Registry, suites: set[str]) -> Plan:
    """Every table and compatible cell of the registry among the selected suites."""
    tables: list[Table] = []
    cells: dict[str, CellPlan] = {}
    skipped: dict[str, str] = {}
    for kind in KINDS:
        if not set(kind.suites) <= suites:
            skipped[kind.name] = f"not selected (--roles): needs {', '.join(kind.suites)}"
            continue
        players = {s: [e.implementation for e in registry.entries(s)] for s in kind.suites}
        nobody = [s for s, names in players.items() if not names]
        if nobody:
            skipped[kind.name] = f"no registered implementation plays {', '.join(nobody)}"
            continue
        fixed_choices: list[dict[str, str]] = [{}]
        for suite in kind.fixed:
            fixed_choices = [{**f, suite: name} for f in fixed_choices for name in players[suite]]
        for fixed in fixed_choices:
            tid = "--".join([kind.name, *(_slug(fixed[s]) for s in kind.fixed)])
            table = Table(tid, kind, fixed, players[kind.rows], players[kind.columns])
            for row in table.rows:
                for column in table.columns:
                    who = {kind.rows: row, kind.columns: column, **fixed}
                    cell, why = combination(registry, kind, who, tid)
                    if cell is None:
                        table.not_cells[(row, column)] = why or "not a cell"
                    else:
                        table.cells[(row, column)] = cell.id
                        cells[cell.id] = cell
            tables.append(table)
    return Plan(tables, cells, skipped)
