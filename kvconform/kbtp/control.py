"""The control channel of the ``cmd:`` contract for ``kbtp-initiator``: how the harness asks an initiator process
for operations (docs/kbtp-wire.md).

The harness serves a target on a port it chooses and starts the initiator under test with the template's
placeholders filled in: ``{target}`` (``kbtp+iwarp://127.0.0.1:PORT`` or ``kbtp+roce://...``) and, optionally,
``{initiator_id}`` (32 hex digits) and ``{features}`` (comma-separated names). The process connects to
``{target}`` at once, then reads one JSON object per line on stdin and answers each with one JSON object per
line on stdout, in any order, echoing ``id``:

    {"id": 1, "op": "hello"}                       -> {"id": 1, "granted": ["DIRECT_LOAD", ...] | null, ...}
    {"id": 2, "op": "alloc_store", "handle": 4096, "data": "<hex>", "seal": true}
    {"id": 3, "op": "store", "handle": 4096, "data": "<hex>", "seal": true, "generation": 0}
    {"id": 4, "op": "load", "handle": 4096, "length": 16, "allow_unsealed": false, "generation": 0}
    {"id": 5, "op": "free", "handle": 4096, "generation": 0}
    {"id": 6, "op": "direct_load", "handle": 4096, "length": 16}
    {"id": 7, "op": "direct_alloc", "handle": 4096, "data": "<hex>"}
    {"id": 8, "op": "goodbye", "release": false}

Every answer carries the operation's result (``status``, ``generation``, ``data_length``, ``block_offset``,
``data`` as hex or null, ``detail``) and the session's ``initiator_id``, ``handle_base``, ``handle_count`` and
``quota`` as the initiator knows them; an operation that failed in the initiator itself answers ``error`` (a
string). stdout carries nothing else (logs go to stderr). stdin's end means: disconnect and exit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OPS = ("hello", "alloc_store", "store", "load", "free", "direct_load", "direct_alloc", "goodbye")
FIELDS: dict[str, tuple[str, ...]] = {  # each op's arguments besides id and op
    "hello": (), "alloc_store": ("handle", "data", "seal"), "store": ("handle", "data", "seal", "generation"),
    "load": ("handle", "length", "allow_unsealed", "generation"), "free": ("handle", "generation"),
    "direct_load": ("handle", "length"), "direct_alloc": ("handle", "data"), "goodbye": ("release",),
}


class ControlError(ValueError):
    """A control line that breaks the contract; the message names the field."""


def request(rid: int, op: str, **args: Any) -> bytes:
    """One request line."""
    if op not in OPS:
        raise ControlError(f"op {op!r}: expected one of {', '.join(OPS)}")
    body: dict[str, Any] = {"id": rid, "op": op}
    for name, value in args.items():
        body[name] = value.hex() if isinstance(value, bytes | bytearray) else value
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def parse_request(line: bytes | str) -> dict[str, Any]:
    """A request line -> its fields (``data`` as bytes); ControlError naming what is wrong."""
    try:
        body = json.loads(line)
    except ValueError as exc:
        raise ControlError(f"request line is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("id"), int):
        raise ControlError("request: expected an object with an integer id")
    op = body.get("op")
    if op not in OPS:
        raise ControlError(f"request {body['id']}: op {op!r}: expected one of {', '.join(OPS)}")
    for name in FIELDS[op]:
        if name not in body:
            raise ControlError(f"request {body['id']} ({op}): field {name!r} missing")
    if "data" in body:
        try:
            body["data"] = bytes.fromhex(str(body["data"]))
        except ValueError as exc:
            raise ControlError(f"request {body['id']} ({op}): field 'data' is not hex: {exc}") from exc
    return body


@dataclass
class Answer:
    """One answer line, parsed."""

    id: int
    fields: dict[str, Any]

    @property
    def error(self) -> str | None:
        err = self.fields.get("error")
        return None if err is None else str(err)


def answer(rid: int, **fields: Any) -> bytes:
    body = {"id": rid, **{k: (v.hex() if isinstance(v, bytes | bytearray) else v) for k, v in fields.items()}}
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def parse_answer(line: bytes | str) -> Answer:
    try:
        body = json.loads(line)
    except ValueError as exc:
        raise ControlError(f"answer line is not JSON: {str(line)[:80]!r}: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("id"), int):
        raise ControlError(f"answer: expected an object with an integer id, got {str(line)[:80]!r}")
    return Answer(int(body.pop("id")), body)
