"""The one error KVCS decoding and validation raise: it names the field, the offset and the requirement."""

from __future__ import annotations

__all__ = ["KvcsError"]


class KvcsError(ValueError):
    """A KVCS structure (namespace, track name, object payload, manifest, cache spec) breaks the text."""

    def __init__(self, field: str, problem: str, *, requirement: str = "", offset: int | None = None) -> None:
        self.field = field
        self.problem = problem
        self.requirement = requirement
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        cite = f" [{requirement}]" if requirement else ""
        super().__init__(f"{field}{where}: {problem}{cite}")
