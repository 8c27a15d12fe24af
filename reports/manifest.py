"""The report folder's SHA-256 manifest, and its signature, so a certification body can tell it was not edited.

``manifest.sha256`` lists every file of the report folder (relative paths, sorted, in ``sha256sum`` format, so
``sha256sum -c manifest.sha256`` checks it too); the run writes it last. ``kvconform report sign`` signs the
manifest with a key the user gives (Ed25519, or ECDSA P-256 with SHA-256), writing ``manifest.sig`` (JSON: the
algorithm, the signature, the public key and the manifest's SHA-256); ``kvconform report verify`` finds every
edited, added or removed file and checks the signature, with the public key the user gives (``--pub``) or, when
none is given, the one the signature names (which shows integrity, not who signed).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

__all__ = ["MANIFEST", "SIGNATURE", "ManifestError", "Verification", "generate_key", "hash_tree", "sign",
           "verify", "write_manifest"]

MANIFEST = "manifest.sha256"
SIGNATURE = "manifest.sig"
_SIG_FORMAT = "kvconform-signature/1"
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


def _key_id(public: Any) -> str:
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _algorithm(key: Any) -> str:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "ed25519"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return "ecdsa-p256-sha256"
    raise ManifestError(f"key type {type(key).__name__}: expected an Ed25519 or ECDSA P-256 key")


def _load_private(path: Path) -> Any:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ManifestError(f"--key {path}: cannot load an unencrypted PEM private key: {exc}") from None
    _algorithm(key)
    return key


def _load_public(data: bytes, where: str) -> Any:
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ManifestError(f"{where}: cannot load a PEM public key: {exc}") from None
    _algorithm(key)
    return key


def generate_key(path: str | os.PathLike[str], algorithm: str = "ed25519") -> tuple[Path, Path]:
    """Write a new private key (PEM, unencrypted, mode 0600) and its public key (``<path>.pub.pem``)."""
    key: Any = ed25519.Ed25519PrivateKey.generate() if algorithm == "ed25519" else ec.generate_private_key(
        ec.SECP256R1())
    out = Path(path)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = out.with_name(out.name + ".pub.pem")
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return out, pub


def _compare(root: Path) -> Verification:
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


def sign(report_dir: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> Path:
    """Sign the folder's manifest with the private key at ``key_path``; refuses when the folder no longer
    matches its manifest (signing must not bless an edit)."""
    root = Path(report_dir)
    key = _load_private(Path(key_path))
    check = _compare(root)
    if check.edited or check.added or check.removed:
        raise ManifestError(f"{root}: the folder does not match its {MANIFEST}, not signing: "
                            + "; ".join(check.lines()[:-1][:10]))
    data = (root / MANIFEST).read_bytes()
    algorithm = _algorithm(key)
    signature = key.sign(data) if algorithm == "ed25519" else key.sign(data, ec.ECDSA(hashes.SHA256()))
    public = key.public_key()
    doc = {"format": _SIG_FORMAT, "algorithm": algorithm, "manifest": MANIFEST,
           "manifest_sha256": hashlib.sha256(data).hexdigest(),
           "signature": base64.b64encode(signature).decode("ascii"),
           "public_key": public.public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii"),
           "public_key_sha256": _key_id(public)}
    out = root / SIGNATURE
    out.write_text(json.dumps(doc, indent=1) + "\n", "utf-8")
    return out


def verify(report_dir: str | os.PathLike[str], pub_path: str | os.PathLike[str] | None = None) -> Verification:
    """Compare the folder with its manifest and check the signature: with ``pub_path`` a signature by that key is
    required; without, a signature present is checked against the public key it carries."""
    root = Path(report_dir)
    result = _compare(root)
    sig_path = root / SIGNATURE
    expected_key = None
    if pub_path is not None:
        try:
            expected_key = _load_public(Path(pub_path).read_bytes(), f"--pub {pub_path}")
        except OSError as exc:
            raise ManifestError(f"--pub {pub_path}: cannot read: {exc.strerror or exc}") from None
    if not sig_path.exists():
        if expected_key is not None:
            result.signature = "required"
            result.problems.append(f"{SIGNATURE}: missing, but --pub asks for a signature")
        return result
    try:
        doc = json.loads(sig_path.read_text("utf-8"))
        signature = base64.b64decode(doc["signature"], validate=True)
        carried = _load_public(str(doc["public_key"]).encode(), str(sig_path))
        algorithm = str(doc["algorithm"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result.signature = "invalid"
        result.problems.append(f"{sig_path}: not a kvconform signature: {exc}")
        return result
    key = expected_key if expected_key is not None else carried
    result.signer = _key_id(key)
    data = (root / MANIFEST).read_bytes()
    try:
        if algorithm != _algorithm(key):
            raise InvalidSignature
        if algorithm == "ed25519":
            key.verify(signature, data)
        else:
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        result.signature = "invalid"
        who = "the key given by --pub" if expected_key is not None else "the public key it carries"
        result.problems.append(f"{SIGNATURE}: the signature of {MANIFEST} does not verify with {who}")
        return result
    result.signature = "valid"
    return result
