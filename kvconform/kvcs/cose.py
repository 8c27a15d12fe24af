"""``manifest.cose``: the manifest JSON in a COSE_Sign1 (RFC 9052) signed with the producer key.

ES256 (ECDSA P-256 with SHA-256, alg -7, signature r || s) or EdDSA (Ed25519, alg -8). The key identifier
goes into the ``kid`` header parameter (label 4): we put it in the protected header, and accept it in either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

__all__ = ["ALGORITHMS", "CoseError", "ProducerKey", "PublicKey", "load_public_key", "sign", "verify"]

REQ_COSE = "KVCS-MANIFEST-COSE-SIGN"
COSE_SIGN1_TAG = 18
HDR_ALG = 1
HDR_KID = 4
ALGORITHMS: dict[str, int] = {"ES256": -7, "EdDSA": -8}
_ALG_NAMES = {v: k for k, v in ALGORITHMS.items()}

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class CoseError(ValueError):
    """A manifest.cose payload that is not a valid COSE_Sign1 from a known producer key."""


@dataclass(frozen=True)
class ProducerKey:
    """A producer's signing key with its algorithm and key identifier."""

    alg: str
    kid: bytes
    key: PrivateKey

    @classmethod
    def generate(cls, alg: str, kid: bytes) -> ProducerKey:
        if alg == "ES256":
            return cls(alg, kid, ec.generate_private_key(ec.SECP256R1()))
        if alg == "EdDSA":
            return cls(alg, kid, ed25519.Ed25519PrivateKey.generate())
        raise CoseError(f"alg {alg!r}: expected one of {', '.join(ALGORITHMS)}")

    @classmethod
    def from_pem(cls, alg: str, kid: bytes, pem: bytes | str) -> ProducerKey:
        key = serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
            raise CoseError(f"producer key {kid!r}: a {type(key).__name__}, expected P-256 or Ed25519")
        found = "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "EdDSA"
        if found != alg:
            raise CoseError(f"producer key {kid!r}: the PEM holds an {found} key, the spec says {alg}")
        return cls(alg, kid, key)

    def private_pem(self) -> str:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()

    def public_key(self) -> PublicKey:
        return self.key.public_key()

    def public_pem(self) -> str:
        return self.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def load_public_key(pem: bytes | str | PublicKey) -> PublicKey:
    if isinstance(pem, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        return pem
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        raise CoseError(f"public key: a {type(key).__name__}, expected P-256 or Ed25519")
    return key


def _to_be_signed(protected: bytes, payload: bytes) -> bytes:
    return bytes(cbor2.dumps(["Signature1", protected, b"", payload]))


def sign(payload: bytes, key: ProducerKey) -> bytes:
    """COSE_Sign1 (tag 18) over ``payload`` with ``alg`` and ``kid`` in the protected header."""
    protected = bytes(cbor2.dumps({HDR_ALG: ALGORITHMS[key.alg], HDR_KID: key.kid}))
    tbs = _to_be_signed(protected, payload)
    if isinstance(key.key, ec.EllipticCurvePrivateKey):
        r, s = decode_dss_signature(key.key.sign(tbs, ec.ECDSA(hashes.SHA256())))
        signature = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        signature = key.key.sign(tbs)
    return bytes(cbor2.dumps(cbor2.CBORTag(COSE_SIGN1_TAG, [protected, {}, payload, signature])))


def _structure(data: bytes) -> tuple[bytes, Mapping[Any, Any], Mapping[Any, Any], bytes, bytes]:
    try:
        obj = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises several types for malformed input
        raise CoseError(f"manifest.cose: not CBOR ({exc}) [{REQ_COSE}]") from exc
    if isinstance(obj, cbor2.CBORTag):
        if obj.tag != COSE_SIGN1_TAG:
            raise CoseError(f"manifest.cose: CBOR tag {obj.tag}, expected 18 (COSE_Sign1) [{REQ_COSE}]")
        obj = obj.value
    if not (isinstance(obj, list | tuple) and len(obj) == 4):
        raise CoseError(f"manifest.cose: not a 4-element COSE_Sign1 array [{REQ_COSE}]")
    protected, unprotected, payload, signature = obj
    if not (isinstance(protected, bytes) and isinstance(unprotected, Mapping) and isinstance(payload, bytes)
            and isinstance(signature, bytes)):
        raise CoseError(f"manifest.cose: COSE_Sign1 element types are not (bstr, map, bstr, bstr) [{REQ_COSE}]")
    try:
        prot = cbor2.loads(protected) if protected else {}
    except Exception as exc:
        raise CoseError(f"manifest.cose: protected header is not CBOR ({exc}) [{REQ_COSE}]") from exc
    if not isinstance(prot, Mapping):
        raise CoseError(f"manifest.cose: protected header is not a map [{REQ_COSE}]")
    return protected, prot, unprotected, payload, signature


def verify(data: bytes, public_keys: Mapping[bytes, bytes | str | PublicKey]) -> bytes:
    """The manifest JSON inside a COSE_Sign1 whose signature verifies with the key ``kid`` names."""
    protected, prot, unprotected, payload, signature = _structure(data)
    alg = prot.get(HDR_ALG)
    kid = prot.get(HDR_KID, unprotected.get(HDR_KID))
    if alg not in _ALG_NAMES:
        raise CoseError(f"manifest.cose: alg {alg!r}, expected ES256 (-7) or EdDSA (-8) [{REQ_COSE}]")
    if not isinstance(kid, bytes):
        raise CoseError(f"manifest.cose: no kid (header parameter 4) naming the producer key [{REQ_COSE}]")
    if kid not in public_keys:
        raise CoseError(f"manifest.cose: kid {kid!r} is not a known producer key [{REQ_COSE}]")
    key = load_public_key(public_keys[kid])
    tbs = _to_be_signed(protected, payload)
    try:
        if alg == ALGORITHMS["ES256"]:
            if not isinstance(key, ec.EllipticCurvePublicKey) or len(signature) != 64:
                raise InvalidSignature
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            key.verify(der, tbs, ec.ECDSA(hashes.SHA256()))
        else:
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise InvalidSignature
            key.verify(signature, tbs)
    except InvalidSignature:
        raise CoseError(f"manifest.cose: the {_ALG_NAMES[alg]} signature does not verify with producer key {kid!r} "
                        f"[{REQ_COSE}]") from None
    return payload
