"""The one error the KVSP functions (profile, JCS) raise: it names the field."""

from __future__ import annotations

__all__ = ["KvspError"]


class KvspError(ValueError):
    """A KVSP input is unusable; the message names the field (``field`` when there is one)."""

    def __init__(self, message: str, *, field: str = "") -> None:
        self.field = field
        super().__init__(message)
