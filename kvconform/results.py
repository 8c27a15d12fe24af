"""A check's recorded result, as the plugin collects it and every report writer reads it, and which results gate the
exit status (docs/conventions.md, "Gating levels"; the blame rule: a failed check fails only the requirement its
failing assertion named)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvconform.verdicts import Verdict, gates

__all__ = ["NOT_REACHED", "OK_VERDICTS", "TestResult", "gating_failures"]

NOT_REACHED = "not-reached"
OK_VERDICTS = frozenset({Verdict.PASS, Verdict.NOT_APPLICABLE, Verdict.XFAIL})


@dataclass(frozen=True)
class TestResult:
    """The outcome of one test as the plugin collected it on the controller."""

    __test__ = False  # not a pytest test class despite the name

    nodeid: str
    suite: str | None
    reqs: tuple[str, ...]
    level: str | None
    verdict: str
    message: str = ""
    duration: float = 0.0
    evidence: str | None = None
    seed: int | None = None
    blamed: str | None = None  # a failed test: the requirement its failing assertion named
    reached: tuple[str, ...] | None = None  # the requirements an assertion evaluated (None: not recorded)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        out = asdict(self)
        out["reqs"] = list(self.reqs)
        out["reached"] = None if self.reached is None else list(self.reached)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TestResult:
        """The inverse of ``as_dict`` (a coverage.json's "tests")."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["reqs"] = tuple(fields.get("reqs", ()))
        if fields.get("reached") is not None:
            fields["reached"] = tuple(fields["reached"])
        return cls(**fields)

    def verdict_for(self, rid: str) -> str:
        """This test's verdict for one requirement it cites (the blame rule)."""
        if self.verdict == Verdict.FAIL:
            return Verdict.FAIL if self.blamed in (None, rid) else NOT_REACHED
        if self.verdict == Verdict.PASS and self.reached is not None and rid not in self.reached:
            return NOT_REACHED
        return self.verdict


def gating_failures(results: Iterable[TestResult], strict: bool) -> list[TestResult]:
    """Tests whose level gates and whose verdict is not pass, not-applicable or xfail."""
    return [r for r in results if gates(r.level, strict=strict) and r.verdict not in OK_VERDICTS]
