"""Declarative crafting of malformed MOQT messages and data streams (the negative-test path).

Like a scapy layer: a message is an ordered list of named fields; the computed ones (Message Type,
Message Length) are filled from the body unless the test sets them, so a malformed message is a valid
one with one explicit wrong value.  Nothing here validates: the checked encoders live in ``messages``,
``structures``, ``filters`` and ``data``.

    CraftedMessage.from_message(Subscribe(...)).set_vi64("Request ID", 3).build()   # wrong parity
    wrong_length(msg, +1); unknown_type(); with_forbidden_param(fetch, Parameter(0x23, FillParameters()))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvconform.moqt.messages import ControlMessage
from kvconform.moqt.parameters import Parameter
from kvconform.moqt.vi64 import encode_vi64

__all__ = [
    "UNKNOWN_MESSAGE_TYPE",
    "CraftedMessage",
    "RawParam",
    "raw_fetch_object",
    "raw_parameters",
    "raw_subgroup_header",
    "raw_subgroup_object",
    "u8",
    "u16",
    "unknown_type",
    "vi64",
    "with_forbidden_param",
    "with_parameters",
    "wrong_length",
]

# Not in the d22 registry (profile §6.1) nor a removed/reserved type.
UNKNOWN_MESSAGE_TYPE = 0x3F


def vi64(value: int, size: int | None = None) -> bytes:
    """A vi64 field, optionally in a longer (non-minimal, still legal) encoding."""
    return encode_vi64(value, size)


def u8(value: int) -> bytes:
    return bytes([value & 0xFF])


def u16(value: int) -> bytes:
    return (value & 0xFFFF).to_bytes(2, "big")


@dataclass(frozen=True)
class CraftedMessage:
    """A control message as ``Type (vi64), Length (16), named body fields``.

    ``length`` None = the body's length; ``msg_type_bytes`` None = the minimal vi64 of ``msg_type``.
    """

    msg_type: int
    fields: tuple[tuple[str, bytes], ...] = ()
    length: int | None = None
    msg_type_bytes: bytes | None = None

    @classmethod
    def from_message(cls, msg: ControlMessage) -> CraftedMessage:
        return cls(msg.TYPE, tuple(msg.segments()))

    def names(self) -> list[str]:
        return [n for n, _ in self.fields]

    def _index(self, name: str) -> int:
        for i, (n, _) in enumerate(self.fields):
            if n == name:
                return i
        raise KeyError(f"no field {name!r}; fields are {self.names()}")

    def get(self, name: str) -> bytes:
        return self.fields[self._index(name)][1]

    def set(self, name: str, data: bytes) -> CraftedMessage:
        """Replace field ``name``'s bytes."""
        i = self._index(name)
        return replace(self, fields=(*self.fields[:i], (name, data), *self.fields[i + 1 :]))

    def set_vi64(self, name: str, value: int, size: int | None = None) -> CraftedMessage:
        return self.set(name, vi64(value, size))

    def insert(self, after: str | None, name: str, data: bytes) -> CraftedMessage:
        """Insert a field after ``after`` (None = at the start of the body)."""
        i = 0 if after is None else self._index(after) + 1
        return replace(self, fields=(*self.fields[:i], (name, data), *self.fields[i:]))

    def append(self, name: str, data: bytes) -> CraftedMessage:
        return replace(self, fields=(*self.fields, (name, data)))

    def remove(self, name: str) -> CraftedMessage:
        i = self._index(name)
        return replace(self, fields=self.fields[:i] + self.fields[i + 1 :])

    def with_length(self, length: int) -> CraftedMessage:
        return replace(self, length=length)

    def with_type(self, msg_type: int, size: int | None = None) -> CraftedMessage:
        return replace(self, msg_type=msg_type, msg_type_bytes=vi64(msg_type, size) if size else None)

    def body(self) -> bytes:
        return b"".join(d for _, d in self.fields)

    def build(self) -> bytes:
        body = self.body()
        length = len(body) if self.length is None else self.length
        if not 0 <= length <= 0xFFFF:
            raise ValueError(f"Message Length {length} does not fit 16 bits")
        head = self.msg_type_bytes if self.msg_type_bytes is not None else vi64(self.msg_type)
        return head + u16(length) + body


@dataclass(frozen=True)
class RawParam:
    """A parameter written as given: absolute ``type`` (delta computed) or an explicit ``delta``."""

    type: int
    value: bytes
    delta: int | None = None


def raw_parameters(params: Sequence[RawParam | Parameter], count: int | None = None) -> bytes:
    """A parameter block in the given order with no allowed-type checks (``count`` overrides N).

    A ``Parameter`` value is encoded by its type's encoder; descending types need an explicit delta.
    """
    out = bytearray(vi64(len(params) if count is None else count))
    prev = 0
    for p in params:
        value = p.value if isinstance(p, RawParam) else p.encode_value()
        delta = p.delta if isinstance(p, RawParam) and p.delta is not None else p.type - prev
        if delta < 0:
            raise ValueError(f"type 0x{p.type:x} after 0x{prev:x}: give RawParam(delta=...) for descending order")
        out += vi64(delta) + value
        prev = prev + delta
    return bytes(out)


def wrong_length(msg: ControlMessage, delta: int) -> bytes:
    """``msg`` with its Message Length off by ``delta`` (the body is unchanged)."""
    return CraftedMessage.from_message(msg).with_length(len(msg.encode_body()) + delta).build()


def unknown_type(msg_type: int = UNKNOWN_MESSAGE_TYPE, body: bytes = b"") -> bytes:
    """A framed message of a type the receiver cannot know."""
    return CraftedMessage(msg_type, (("Body", body),)).build()


def with_parameters(msg: ControlMessage, params: Sequence[RawParam | Parameter], count: int | None = None) -> bytes:
    """``msg`` with its parameter block replaced by ``params`` written unchecked."""
    return CraftedMessage.from_message(msg).set("Parameters", raw_parameters(params, count)).build()


def with_forbidden_param(msg: ControlMessage, extra: Parameter | RawParam) -> bytes:
    """``msg`` plus ``extra`` inserted in Type order into its parameter block (e.g. FILL_PARAMETERS in a
    FETCH, which profile §7.2 forbids)."""
    params = getattr(msg, "parameters", None)
    if params is None:
        raise ValueError(f"{type(msg).__name__} has no parameter block")
    items: list[RawParam | Parameter] = sorted([*params.items, extra], key=lambda p: p.type)
    return with_parameters(msg, items)


# ---------------------------------------------------------------------------------------------------
# Data plane: explicit fields, nothing computed but lengths left as None.


def raw_subgroup_header(
    type_flags: int, track_alias: int, group_id: int, subgroup_id: int | None = None, priority: int | None = None
) -> bytes:
    """SUBGROUP_HEADER with exactly the given fields (None = field omitted)."""
    out = vi64(type_flags) + vi64(track_alias) + vi64(group_id)
    out += b"" if subgroup_id is None else vi64(subgroup_id)
    return out + (b"" if priority is None else u8(priority))


def raw_subgroup_object(
    object_id_delta: int,
    payload: bytes = b"",
    *,
    status: int | None = None,
    properties: bytes | None = None,
    payload_length: int | None = None,
) -> bytes:
    """A subgroup object: ``properties`` None = no Properties Length field; ``status`` written only when
    given; ``payload_length`` None = len(payload)."""
    out = vi64(object_id_delta)
    if properties is not None:
        out += vi64(len(properties)) + properties
    out += vi64(len(payload) if payload_length is None else payload_length)
    if status is not None:
        out += vi64(status)
    return out + payload


def raw_fetch_object(
    flags: int,
    *,
    group_delta: int | None = None,
    subgroup_id: int | None = None,
    object_delta: int | None = None,
    priority: int | None = None,
    properties: bytes | None = None,
    payload: bytes = b"",
    payload_length: int | None = None,
) -> bytes:
    """A fetch object with exactly the given fields, whatever ``flags`` says."""
    out = vi64(flags)
    for v in (group_delta, subgroup_id, object_delta):
        out += b"" if v is None else vi64(v)
    out += b"" if priority is None else u8(priority)
    if properties is not None:
        out += vi64(len(properties)) + properties
    return out + vi64(len(payload) if payload_length is None else payload_length) + payload
