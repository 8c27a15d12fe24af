"""The report folder's signature: ``manifest.sig`` over its SHA-256 manifest (reports.manifest).

``kvconform report sign`` signs the manifest with a key the user gives (Ed25519, or ECDSA P-256 with SHA-256),
writing ``manifest.sig`` (JSON: the algorithm, the signature, the public key and the manifest's SHA-256);
``kvconform report verify`` finds every edited, added or removed file and checks the signature, with the public key
the user gives (``--pub``) or, when none is given, the one the signature names (which shows integrity, not who
signed). Apart from the manifest a run writes, so a run does not import cryptography.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from kvconform.reports.manifest import MANIFEST, SIGNATURE, ManifestError, Verification, compare

__all__ = ["generate_key", "sign", "verify"]

_SIG_FORMAT = "kvconform-signature/1"


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


def sign(report_dir: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> Path:
    """Sign the folder's manifest with the private key at ``key_path``; refuses when the folder no longer
    matches its manifest (signing must not bless an edit)."""
    root = Path(report_dir)
    key = _load_private(Path(key_path))
    check = compare(root)
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
    result = compare(root)
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
