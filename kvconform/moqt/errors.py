"""MOQT draft-22 error-code registries (profile §10) and the codec's decode error.

Four separate number spaces: session termination (QUIC CONNECTION_CLOSE), REQUEST_ERROR, PUBLISH_DONE
status and stream reset / STOP_SENDING.  An unknown code is read as INTERNAL_ERROR (profile §10), so the
enums are never used to *reject* a peer's code: use ``lookup`` for display.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = [
    "MoqtDecodeError",
    "MoqtEncodeError",
    "NeedMoreData",
    "PublishDoneCode",
    "RequestErrorCode",
    "SessionError",
    "StreamResetCode",
    "is_grease",
    "lookup",
]


class SessionError(IntEnum):
    """Session termination codes, profile §10.1 (sent in an application CONNECTION_CLOSE)."""

    NO_ERROR = 0x0
    INTERNAL_ERROR = 0x1
    UNAUTHORIZED = 0x2
    PROTOCOL_VIOLATION = 0x3
    INVALID_REQUEST_ID = 0x4
    DUPLICATE_TRACK_ALIAS = 0x5
    KEY_VALUE_FORMATTING_ERROR = 0x6
    INVALID_PATH = 0x8
    MALFORMED_PATH = 0x9
    GOAWAY_TIMEOUT = 0x10
    CONTROL_MESSAGE_TIMEOUT = 0x11
    DATA_STREAM_TIMEOUT = 0x12
    AUTH_TOKEN_CACHE_OVERFLOW = 0x13
    DUPLICATE_AUTH_TOKEN_ALIAS = 0x14
    MALFORMED_AUTH_TOKEN = 0x16
    UNKNOWN_AUTH_TOKEN_ALIAS = 0x17
    EXPIRED_AUTH_TOKEN = 0x18
    INVALID_AUTHORITY = 0x19
    MALFORMED_AUTHORITY = 0x1A
    TOO_MANY_REQUEST_UPDATES = 0x1B


class RequestErrorCode(IntEnum):
    """REQUEST_ERROR codes, profile §10.2."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TIMEOUT = 0x2
    NOT_SUPPORTED = 0x3
    MALFORMED_AUTH_TOKEN = 0x4
    EXPIRED_AUTH_TOKEN = 0x5
    GOING_AWAY = 0x6
    EXCESSIVE_LOAD = 0x9
    DOES_NOT_EXIST = 0x10
    INVALID_RANGE = 0x11
    MALFORMED_TRACK = 0x12
    UNINTERESTED = 0x20
    PREFIX_OVERLAP = 0x30
    NAMESPACE_TOO_LARGE = 0x31
    UNSUPPORTED_EXTENSION = 0x33
    REDIRECT = 0x34
    CONFLICTING_FILTERS = 0x35
    INVALID_FILTER = 0x36


class PublishDoneCode(IntEnum):
    """PUBLISH_DONE status codes, profile §10.3 (0x3 SUBSCRIPTION_ENDED was removed in d20+)."""

    INTERNAL_ERROR = 0x0
    UNAUTHORIZED = 0x1
    TRACK_ENDED = 0x2
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    EXPIRED = 0x6
    UPDATE_FAILED = 0x8
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


class StreamResetCode(IntEnum):
    """RESET_STREAM / STOP_SENDING application codes for every MOQT stream, profile §10.4."""

    INTERNAL_ERROR = 0x0
    CANCELLED = 0x1
    DELIVERY_TIMEOUT = 0x2
    SESSION_CLOSED = 0x3
    GOING_AWAY = 0x4
    TOO_FAR_BEHIND = 0x5
    UNKNOWN_OBJECT_STATUS = 0x6
    EXPIRED_AUTH_TOKEN = 0x7
    EXCESSIVE_LOAD = 0x9
    MALFORMED_TRACK = 0x12


def is_grease(code: int) -> bool:
    """True for the reserved GREASE values 0x7f*N + 0x9D of every registry (profile §5, §8, §10)."""
    return code >= 0x9D and (code - 0x9D) % 0x7F == 0


def lookup(registry: type[IntEnum], code: int) -> str:
    """Display name of ``code`` in ``registry``; unknown codes read as INTERNAL_ERROR (profile §10)."""
    try:
        return registry(code).name
    except ValueError:
        kind = "GREASE" if is_grease(code) else "unknown"
        return f"{kind} 0x{code:x} (treated as INTERNAL_ERROR)"


class MoqtDecodeError(ValueError):
    """Bytes that are not a valid MOQT encoding.

    ``field`` names the field being read, ``offset`` is the byte offset of that field in the buffer the
    caller passed in, and ``code`` is the session termination code a receiver closes with (profile §3,
    §4.2: PROTOCOL_VIOLATION unless the text names another, e.g. KEY_VALUE_FORMATTING_ERROR).
    """

    def __init__(
        self,
        field: str,
        offset: int,
        message: str,
        code: SessionError = SessionError.PROTOCOL_VIOLATION,
    ) -> None:
        self.field = field
        self.offset = offset
        self.message = message
        self.code = code
        super().__init__(f"{field} at offset {offset}: {message} (close {code.name} 0x{int(code):x})")


class NeedMoreData(MoqtDecodeError):
    """The buffer ends inside ``field``; not an error on a stream that has not ended yet."""

    def __init__(self, field: str, offset: int, message: str = "buffer ends inside this field") -> None:
        super().__init__(field, offset, message)


class MoqtEncodeError(ValueError):
    """The checked encoder refused a value the profile forbids; the message names the field and rule."""
