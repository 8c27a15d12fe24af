"""The matrix cut by what its participants speak: one page per MOQT draft (the KVCS cells) and per RDMA binding
(the KBTP cells), beside ``matrix.html`` under names that stay the same from run to run
(``matrix-draft-22.html``, ``matrix-binding-rdmap-7306.html``), so a published folder's ``latest`` copy has a
stable link per draft and per binding.

A cell is on a cut's page when the version its participants share (matrix.json ``cells[].versions``: a draft for
KVCS, a binding for KBTP) includes the cut's; the tables keep their rows and columns, and a cell of another
draft or binding shows as not a cell of this cut.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

__all__ = ["AXES", "cut_document", "cut_file", "matrix_cuts"]

# axis -> (the cell kind whose versions are that axis, what a person calls a value of it)
AXES: dict[str, tuple[str, str]] = {"draft": ("kvcs", "MOQT draft"), "binding": ("kbtp", "RDMA binding")}


def cut_file(axis: str, value: str) -> str:
    """The page's file name, beside matrix.html."""
    return f"matrix-{axis}-{re.sub(r'[^A-Za-z0-9.]+', '-', value).strip('-') or 'none'}.html"


def matrix_cuts(doc: Mapping[str, Any]) -> dict[str, dict[str, list[str]]]:
    """axis -> value -> the ids of the (non-isolation) cells on that value's page, values sorted."""
    found: dict[str, dict[str, list[str]]] = {}
    for axis, (kind, _) in AXES.items():
        values: dict[str, list[str]] = {}
        for cell in doc["cells"]:
            if cell["kind"] == kind and not cell["isolation"]:
                for version in cell["versions"]:
                    values.setdefault(str(version), []).append(cell["id"])
        if values:
            found[axis] = dict(sorted(values.items()))
    return found


def cut_document(doc: Mapping[str, Any], axis: str, value: str, cell_ids: list[str]) -> dict[str, Any]:
    """The matrix document as that cut's page shows it: its kind's tables with only the cut's cells (the others
    listed as not a cell of the cut), those cells, the role suites of their participants, and counts of them."""
    kind, label = AXES[axis]
    keep = set(cell_ids)
    tables = []
    for table in doc["tables"]:
        if table["kind"] != kind:
            continue
        cells = [c for c in table["cells"] if c["cell"] in keep]
        elsewhere = [{"row": c["row"], "column": c["column"], "why": f"not a {label} {value} cell"}
                     for c in table["cells"] if c["cell"] not in keep]
        if cells:
            tables.append({**table, "cells": cells, "not_cells": [*table["not_cells"], *elsewhere]})
    cells = [c for c in doc["cells"] if c["id"] in keep]
    who = {(name, suite) for c in cells for suite, name in c["participants"].items()}
    suites = [s for s in doc["suites"] if (s["implementation"], s["suite"]) in who]
    counts = Counter(c["outcome"] for c in cells)
    summary = {**doc["summary"], "cells": len(cells),
               "outcomes": {o: counts.get(o, 0) for o in doc["summary"]["outcomes"]}, "isolation_cells": 0,
               "suites": len(suites), "suite_outcomes": dict(Counter(s["outcome"] for s in suites))}
    return {**doc, "tables": tables, "cells": cells, "suites": suites, "summary": summary, "skipped_tables": {}}
