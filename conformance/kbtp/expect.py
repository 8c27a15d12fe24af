"""Assertions the KBTP checks share: each names the field, the value seen, the value expected and the
requirement id, and records the observation as evidence."""

from __future__ import annotations

from collections.abc import Collection

from kvconform.conformance.kbtp.client import HarnessError, Reply
from kvconform.fixtures import evidence
from kvconform.kbtp.constants import Status


def status_name(value: int) -> str:
    try:
        return Status(value).name
    except ValueError:
        return f"unknown status {value}"


def status_is(reply: Reply, expected: Status | Collection[Status], *, req: str, what: str) -> None:
    """The completion's Status is ``expected`` (or one of them)."""
    allowed = {expected} if isinstance(expected, Status) else set(expected)
    evidence.record("note", "kbtp-check", {"what": what, "status": status_name(reply.status),
                                           "expected": sorted(s.name for s in allowed), "requirement": req})
    if reply.status not in {int(s) for s in allowed}:
        names = " or ".join(sorted(s.name for s in allowed))
        raise HarnessError(f"{req}: {what}: Status at offset 22 is {status_name(reply.status)} "
                           f"({reply.status}), expected {names}")


def equal(field: str, seen: object, expected: object, *, req: str, offset: int | None = None) -> None:
    if seen != expected:
        at = f" at offset {offset}" if offset is not None else ""
        raise HarnessError(f"{req}: {field}{at} is {_fmt(seen)}, expected {_fmt(expected)}")


def holds(condition: bool, text: str, *, req: str) -> None:
    if not condition:
        raise HarnessError(f"{req}: {text}")


def _fmt(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value} ({value:#x})"
    if isinstance(value, bytes):
        return value[:48].hex(" ") + (" ..." if len(value) > 48 else "")
    return repr(value)
