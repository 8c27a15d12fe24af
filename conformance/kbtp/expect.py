"""KBTP phrasing of the assertion API (kvconform.verdicts): a completion's Status by name, a field at its
offset. Each is one assertion naming its requirement; a failure is a ``Violation`` of exactly that id."""

from __future__ import annotations

from collections.abc import Collection

from kvconform import evidence
from kvconform.kbtp.constants import Status
from kvconform.kbtp.messages import Completion, HelloAck
from kvconform.targets.kbtp_client import Ended, Reply
from kvconform.verdicts import check, check_equal

STATUS_OFFSET = 22  # of the common header


def status_name(value: int) -> str:
    try:
        return Status(value).name
    except ValueError:
        return f"unknown status {value}"


def status_is(reply: Reply | Ended | HelloAck | Completion, expected: Status | Collection[Status], *, req: str,
              what: str) -> None:
    """The completion's Status is ``expected``, or one of them where the text allows several outcomes (a
    request that fails two checks whose order the text leaves open). A connection that ended instead of the
    completion fails ``req`` too."""
    allowed = {expected} if isinstance(expected, Status) else set(expected)
    names = " or ".join(sorted(s.name for s in allowed))
    if isinstance(reply, Ended):
        check(False, f"{what}: the connection ended ({reply.reason}) instead of a completion", req=req,
              expected=f"Status {names}")
        return
    evidence.record("note", "kbtp-check", {"what": what, "status": status_name(reply.status),
                                           "expected": sorted(s.name for s in allowed), "requirement": req})
    check(reply.status in {int(s) for s in allowed}, f"{what}: Status at offset {STATUS_OFFSET}", req=req,
          seen=f"{status_name(reply.status)} ({reply.status})", expected=names)


def equal(field: str, seen: object, expected: object, *, req: str, offset: int | None = None) -> None:
    """``field`` (at ``offset`` when given) is ``expected``."""
    check_equal(f"{field} at offset {offset}" if offset is not None else field, seen, expected, req=req)


def holds(condition: bool, text: str, *, req: str) -> None:
    """``condition`` holds; ``text`` says what was seen when it does not."""
    check(condition, text, req=req)
