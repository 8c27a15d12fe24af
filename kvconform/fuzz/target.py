"""A fuzz target: one parser reachable from bytes a target sends, and what it may answer them with."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["FuzzTarget", "IntField", "OracleError"]


class OracleError(AssertionError):
    """Two views of the same bytes disagree (a round trip, or whole versus split feeding): a finding.

    It is never among a target's accepted errors, so the engines report it like any other crash.
    """


@dataclass(frozen=True)
class IntField:
    """An integer field at a fixed offset: where boundary values are worth substituting (lengths, counts)."""

    offset: int
    size: int  # octets: 1, 2, 4 or 8
    byteorder: str = "big"


@dataclass(frozen=True)
class FuzzTarget:
    """One parser under fuzz: ``parse(data)`` may return anything or raise one of ``accepts``.

    ``seeds`` yields valid encodings (from the project's encoders and vectors) that start the corpus;
    ``dictionary``, ``int_fields`` and ``varints`` steer the pure-Python mutator towards the structure
    (magic values and tokens, fixed-layout lengths and counts, MOQT vi64 fields).
    """

    name: str
    protocol: str
    description: str
    parse: Callable[[bytes], object]
    accepts: tuple[type[BaseException], ...]
    seeds: Callable[[], Iterable[bytes]]
    dictionary: tuple[bytes, ...] = ()
    int_fields: tuple[IntField, ...] = ()
    varints: bool = False
    max_len: int = 4096

    def accepted_names(self) -> list[str]:
        """The accepted error classes as ``module.Class`` (for listings and reports)."""
        return [f"{e.__module__}.{e.__qualname__}" for e in self.accepts]
