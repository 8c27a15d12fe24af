"""Findings: an input a parser did not answer with its typed error, saved so it replays.

A finding file is JSON: the parser, the kind (crash, hang, memory, died), the input bytes as hex, the
engine, seed and input number that produced it, the error, its signature and traceback.  ``kvconform fuzz
<parser> --replay FILE`` runs it again (FILE may also be a raw input, e.g. a corpus file or an atheris
artifact).
"""

from __future__ import annotations

import hashlib
import json
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["KINDS", "Finding", "load_input", "signature_of"]

KINDS = ("crash", "hang", "memory", "died")
_PACKAGE_MARK = "/kvconform/"


def _package_path(filename: str) -> str | None:
    """``kvconform/...`` for a frame in this package, else None."""
    path = filename.replace("\\", "/")
    at = path.rfind(_PACKAGE_MARK)
    return path[at + 1 :] if at >= 0 else None


def signature_of(kind: str, exc: BaseException | None, tb: TracebackType | None = None) -> str:
    """``<kind> <Error> at <file>:<line> in <function>`` naming the innermost frame of a kvconform parser
    (else of kvconform, else the innermost): one line per distinct bug, however many inputs reach it."""
    name = type(exc).__name__ if exc is not None else "-"
    frames = list(traceback.extract_tb(tb if tb is not None else exc.__traceback__ if exc is not None else None))
    frames = [f for f in frames if f.name != "_on_alarm"]  # the worker's timer handler, not the parser
    ours = [f for f in frames if _package_path(f.filename)]
    parsers = [f for f in ours if not str(_package_path(f.filename)).startswith("kvconform/fuzz/")]
    chosen = parsers or ours or frames
    if not chosen:
        return f"{kind} {name}"
    frame = chosen[-1]
    where = _package_path(frame.filename) or Path(frame.filename).name
    return f"{kind} {name} at {where}:{frame.lineno} in {frame.name}"


@dataclass(frozen=True)
class Finding:
    """One input that crashed, hung or blew the memory bound of a parser, and how to reproduce it."""

    parser: str
    kind: str
    input_hex: str
    signature: str
    error: str
    traceback: str
    engine: str
    seed: int | None
    index: int | None
    source: str = ""

    @property
    def data(self) -> bytes:
        return bytes.fromhex(self.input_hex)

    def file_name(self) -> str:
        return f"{self.kind}-{hashlib.sha1(self.data).hexdigest()[:16]}.json"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Finding:
        return cls(**{k: obj.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]

    def save(self, out_dir: Path) -> Path:
        """Write ``<out_dir>/<parser>/<kind>-<sha1>.json``; returns its path."""
        path = out_dir / self.parser / self.file_name()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n", "utf-8")
        return path

    def replay_command(self, path: Path) -> str:
        return f"kvconform fuzz {self.parser} --replay {path}"


def load_input(path: Path) -> tuple[str | None, bytes]:
    """(parser named in it or None, input bytes) of a finding file or a raw input file."""
    raw = path.read_bytes()
    if path.suffix == ".json":
        try:
            obj = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None, raw
        if isinstance(obj, dict) and isinstance(obj.get("input_hex"), str):
            return obj.get("parser"), bytes.fromhex(obj["input_hex"])
    return None, raw
