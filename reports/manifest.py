"""The report folder's SHA-256 manifest, so a certification body can tell it was not edited.

``manifest.sha256`` lists every file of the report folder (relative paths, sorted, in ``sha256sum`` format, so
``sha256sum -c manifest.sha256`` checks it too); the run writes it last. Its signature (``manifest.sig``: ``kvconform
report sign`` and ``verify``) is reports.signature's, the one part that needs cryptography.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MANIFEST", "SIGNATURE", "ManifestError", "Verification", "compare", "hash_tree", "write_manifest"]

MANIFEST = "manifest.sha256"
SIGNATURE = "manifest.sig"
_EXCLUDED = frozenset({MANIFEST, SIGNATURE})


class ManifestError(ValueError):
    """A manifest, key or signature that cannot be used; the message names the file and what was expected."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_tree(report_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Relative POSIX path -> SHA-256 of every file under ``report_dir`` but the manifest and its signature."""
    root = Path(report_dir)
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in _EXCLUDED or not path.is_file():
                continue
            out[rel] = _digest(path)
    return dict(sorted(out.items()))


def _render(entries: dict[str, str]) -> str:
    return "".join(f"{digest}  {rel}\n" for rel, digest in sorted(entries.items()))


def write_manifest(report_dir: str | os.PathLike[str]) -> Path:
    """Write ``manifest.sha256`` for the folder as it is now (an earlier signature no longer applies: removed)."""
    root = Path(report_dir)
    sig = root / SIGNATURE
    if sig.exists():
        sig.unlink()
    out = root / MANIFEST
    out.write_text(_render(hash_tree(root)), "utf-8")
    return out


def _parse(text: str, where: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not rel:
            raise ManifestError(f"{where}: line {n}: expected '<sha256 hex>  <relative path>', got {line!r}")
        entries[rel] = digest
    return entries


@dataclass
class Verification:
    """What ``verify`` found: files edited, added and removed since the manifest, and the signature's state."""

    edited: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    signature: str = "absent"  # absent | valid | invalid | required
    signer: str = ""  # the public key's SHA-256 (its SubjectPublicKeyInfo DER)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.edited or self.added or self.removed or self.problems) and self.signature in ("valid",
                                                                                                         "absent")

    def lines(self) -> list[str]:
        """What a person reads: one line per problem, then the signature's state."""
        out = [f"edited: {p}" for p in self.edited] + [f"added: {p}" for p in self.added]
        out += [f"removed: {p}" for p in self.removed] + self.problems
        out.append(f"signature: {self.signature}" + (f" (public key sha256 {self.signer})" if self.signer else ""))
        return out


def compare(root: Path) -> Verification:
    manifest = root / MANIFEST
    result = Verification()
    try:
        listed = _parse(manifest.read_text("utf-8"), manifest)
    except OSError as exc:
        raise ManifestError(f"{manifest}: cannot read the manifest: {exc.strerror or exc}") from None
    now = hash_tree(root)
    result.edited = sorted(p for p in listed if p in now and now[p] != listed[p])
    result.removed = sorted(p for p in listed if p not in now)
    result.added = sorted(p for p in now if p not in listed)
    return result
