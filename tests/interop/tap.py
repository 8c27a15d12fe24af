"""TAP version 14 output of a moq-interop-runner test client (aiomoqt's ``moq-interop-client``), parsed.

Each test point is ``ok N - name`` or ``not ok N - name``, optionally with a ``# SKIP reason`` or
``# COMPAT`` directive, followed by a YAML block (``  ---`` ... ``  ...``) with ``message``, ``expected``,
``received`` and the sessions' ALPN/draft. The client exits 0 when every point is ok, 1 otherwise and
127 for an unsupported test case or draft.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

from kvconform import yamlload

__all__ = ["TapError", "TapPoint", "parse_tap"]

_POINT = re.compile(r"^(?P<status>ok|not ok) (?P<num>\d+) - (?P<name>[^#]*?)\s*(?:# (?P<directive>.*))?$")


class TapError(ValueError):
    """The output is not TAP as the client writes it."""


@dataclass(frozen=True)
class TapPoint:
    """One test point and its YAML diagnostics."""

    name: str
    ok: bool
    directive: str = ""
    diagnostics: dict[str, Any] = field(default_factory=dict)

    @property
    def skipped(self) -> bool:
        return self.directive.upper().startswith("SKIP")

    @property
    def compat(self) -> bool:
        """Passed only under a --compat tolerance (never requested by the harness)."""
        return self.directive.upper().startswith("COMPAT") or bool(self.diagnostics.get("compat"))

    def describe(self) -> str:
        """One line for an assertion message: name, status and what the client saw."""
        parts = [f"{self.name}: {'ok' if self.ok else 'not ok'}"]
        if self.directive:
            parts.append(f"# {self.directive}")
        for key in ("message", "expected", "received"):
            if self.diagnostics.get(key):
                parts.append(f"{key}={self.diagnostics[key]!r}")
        return " ".join(parts)


def parse_tap(text: str) -> list[TapPoint]:
    """The test points of a TAP stream; TapError when the header or the plan is missing."""
    lines = text.splitlines()
    if "TAP version 14" not in (line.strip() for line in lines):
        raise TapError(f"no 'TAP version 14' header in {text[:200]!r}")
    points: list[TapPoint] = []
    i = 0
    while i < len(lines):
        match = _POINT.match(lines[i])
        i += 1
        if not match:
            continue
        block: list[str] = []
        if i < len(lines) and lines[i].strip() == "---":
            i += 1
            while i < len(lines) and lines[i].strip() != "...":
                block.append(lines[i])
                i += 1
            i += 1
        try:
            diagnostics = yamlload.safe_load(textwrap.dedent("\n".join(block))) if block else {}
        except yamlload.YAMLError as exc:
            raise TapError(f"test point {match['name']!r}: YAML block does not parse: {exc}") from exc
        points.append(TapPoint(match["name"].strip(), match["status"] == "ok", (match["directive"] or "").strip(),
                               diagnostics if isinstance(diagnostics, dict) else {}))
    if not any(re.match(r"^1\.\.\d+", line) for line in lines):
        raise TapError("no TAP plan line (1..N)")
    return points
