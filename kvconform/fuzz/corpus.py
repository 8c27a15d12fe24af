"""Corpus folders: one raw input per file, named by its SHA-1 (libFuzzer's convention, so atheris reads
and writes the same folders).  The committed corpus is ``vectors/fuzz/<parser>/``; a folder given with
``--corpus DIR`` is read as ``DIR/<parser>/`` when that exists, else as ``DIR`` itself."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvconform.fuzz.target import FuzzTarget
from kvconform.testvectors import vectors_dir

__all__ = ["committed_corpus_dir", "load_corpus", "save_inputs"]


def committed_corpus_dir() -> Path:
    """``vectors/fuzz`` of the packaged (or $KVCONFORM_VECTORS_DIR) vectors."""

    return vectors_dir() / "fuzz"


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")) if folder.is_dir() else []


def load_corpus(target: FuzzTarget, folders: Sequence[Path] = (), *, with_seeds: bool = True,
                with_committed: bool = True) -> list[tuple[str, bytes]]:
    """(where from, input) of the target's generated seeds, its committed corpus and ``folders``, without
    repeats, capped at the target's ``max_len``."""
    seen: set[bytes] = set()
    out: list[tuple[str, bytes]] = []

    def add(label: str, data: bytes) -> None:
        data = data[: target.max_len]
        if data not in seen:
            seen.add(data)
            out.append((label, data))

    if with_seeds:
        for i, data in enumerate(target.seeds()):
            add(f"seed #{i}", bytes(data))
    dirs = ([committed_corpus_dir() / target.name] if with_committed else []) + [
        d / target.name if (d / target.name).is_dir() else d for d in folders]
    for folder in dirs:
        for path in _files(folder):
            add(str(path), path.read_bytes())
    return out


def save_inputs(folder: Path, inputs: Iterable[bytes]) -> list[Path]:
    """Write each input to ``folder/<sha1>``; returns the paths of files that were not there yet."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for data in inputs:
        path = folder / hashlib.sha1(data).hexdigest()
        if not path.exists():
            path.write_bytes(data)
            written.append(path)
    return written
