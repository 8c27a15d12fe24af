"""``manifest.cose``: the manifest JSON in a COSE_Sign1 (RFC 9052) signed with the producer key.

ES256 (ECDSA P-256 with SHA-256, alg -7, signature r || s) or EdDSA (Ed25519, alg -8). The key identifier
goes into the ``kid`` header parameter (label 4): we put it in the protected header, and accept it in either.
What a target sends is read with ``kvconform.kvcs.cbor`` (bounded, definite lengths, the item spans every
octet), so any octets give the payload or a ``CoseError`` naming the field.
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

from kvconform.kvcs.cbor import INDEFINITE, MAJOR_TYPES, CborReader, describe
from kvconform.kvcs.errors import KvcsError, show

__all__ = ["ALGORITHMS", "CoseError", "ProducerKey", "PublicKey", "load_public_key", "sign", "unverified_payload",
           "verify"]

REQ_COSE = "KVCS-MANIFEST-COSE-SIGN"
COSE_SIGN1_TAG = 18
HDR_ALG = 1
HDR_KID = 4
FIELD = "manifest.cose"
_LABEL_NAMES = {HDR_ALG: "alg", 2: "crit", 3: "content type", HDR_KID: "kid"}
ALGORITHMS: dict[str, int] = {"ES256": -7, "EdDSA": -8}
_ALG_NAMES = {v: k for k, v in ALGORITHMS.items()}

PrivateKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey


class CoseError(KvcsError):
    """A manifest.cose payload that is not a valid COSE_Sign1 (RFC 9052 section 4.2) from a known producer key
    (KVCS "Manifest Track"), or a producer key that cannot be used."""

    def __init__(self, field: str, problem: str, *, requirement: str = REQ_COSE, offset: int | None = None) -> None:
        super().__init__(field, problem, requirement=requirement, offset=offset)


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
        raise CoseError("producer key alg", f"{alg!r}, expected one of {', '.join(ALGORITHMS)}")

    @classmethod
    def from_pem(cls, alg: str, kid: bytes, pem: bytes | str) -> ProducerKey:
        key = serialization.load_pem_private_key(pem.encode() if isinstance(pem, str) else pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
            raise CoseError(f"producer key {kid!r}", f"a {type(key).__name__}, expected P-256 or Ed25519")
        found = "ES256" if isinstance(key, ec.EllipticCurvePrivateKey) else "EdDSA"
        if found != alg:
            raise CoseError(f"producer key {kid!r}", f"the PEM holds an {found} key, the spec says {alg}")
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
        raise CoseError("public key", f"a {type(key).__name__}, expected P-256 or Ed25519")
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


@dataclass(frozen=True)
class _Sign1:
    """The four elements of a received COSE_Sign1, typed; ``headers`` is the protected header map decoded."""

    protected: bytes
    headers: Mapping[int | str, Any]
    unprotected: Mapping[int | str, Any]
    payload: bytes
    signature: bytes


def _label(label: int | str) -> str:
    return f"label {show(label)}" + (f" ({_LABEL_NAMES[label]})" if label in _LABEL_NAMES else "")


def _header_map(value: Any, where: str) -> dict[int | str, Any]:
    if not isinstance(value, dict):
        raise CoseError(f"{FIELD} {where}", f"{describe(value)}, expected a header map")
    for label in value:
        if type(label) not in (int, str):
            raise CoseError(f"{FIELD} {where}", f"label {describe(label)}, expected an integer or text string "
                            "(RFC 9052 section 3)")
    return value


def _structure(data: bytes) -> _Sign1:
    """COSE_Sign1 = [protected: bstr .cbor header_map, unprotected: header_map, payload: bstr, signature: bstr],
    tagged 18 or not, spanning every octet of ``data``."""
    reader = CborReader(data, error=CoseError, requirement=REQ_COSE)
    major, _, argument = reader.head(FIELD)
    if major == 6:
        if argument != COSE_SIGN1_TAG:
            raise CoseError(f"{FIELD} tag", f"CBOR tag {argument}, expected 18 (COSE_Sign1) or none", offset=0)
        major, _, argument = reader.head(FIELD)
    if major != 4 or argument not in (4, INDEFINITE):
        what = MAJOR_TYPES[major] + (f" of {argument}" if major in (4, 5) and argument != INDEFINITE else "")
        raise CoseError(FIELD, f"{what}, expected the 4-element COSE_Sign1 array (protected, unprotected, payload, "
                        "signature)", offset=0)
    protected = reader.item(f"{FIELD} protected header")
    unprotected = reader.item(f"{FIELD} unprotected header")
    payload = reader.item(f"{FIELD} payload")
    signature = reader.item(f"{FIELD} signature")
    if argument == INDEFINITE and not reader.at_end() and reader.data[reader.pos] == 0xFF:
        reader.pos += 1  # the break of an indefinite-length array of exactly four elements
    elif argument == INDEFINITE:
        raise CoseError(FIELD, "an indefinite-length array of more than 4 elements (or with no break), expected the "
                        "4-element COSE_Sign1 array", offset=0)
    if not reader.at_end():
        extra = reader.remaining()
        raise CoseError(FIELD, f"{extra} octet{'s' * (extra != 1)} after the COSE_Sign1 structure, expected none: it "
                        "spans the whole Object payload", offset=reader.pos)
    if not isinstance(protected, bytes):
        raise CoseError(f"{FIELD} protected header", f"{describe(protected)}, expected a byte string holding the "
                        "encoded header map")
    headers = _header_map(CborReader(protected, error=CoseError, requirement=REQ_COSE).whole(
        f"{FIELD} protected header") if protected else {}, "protected header")
    unprotected = _header_map(unprotected, "unprotected header")
    if not isinstance(payload, bytes):
        detached = " (a detached payload: KVCS carries the manifest inside)" if payload is None else ""
        raise CoseError(f"{FIELD} payload", f"{describe(payload)}{detached}, expected the manifest JSON as a byte "
                        "string")
    if not isinstance(signature, bytes):
        raise CoseError(f"{FIELD} signature", f"{describe(signature)}, expected a byte string")
    both = headers.keys() & unprotected.keys()
    if both:
        raise CoseError(f"{FIELD} unprotected header {_label(min(both, key=repr))}", "also in the protected header: "
                        "a label MUST NOT be in both (RFC 9052 section 3)")
    return _Sign1(protected, headers, unprotected, payload, signature)


def unverified_payload(data: bytes) -> bytes:
    """The payload of a well-formed COSE_Sign1, signature not checked (no producer key known, authenticity not
    required)."""
    return _structure(data).payload


def verify(data: bytes, public_keys: Mapping[bytes, bytes | str | PublicKey]) -> bytes:
    """The manifest JSON inside a COSE_Sign1 whose signature verifies with the key ``kid`` names; CoseError
    naming the field for any other octets."""
    sign1 = _structure(data)
    alg = sign1.headers.get(HDR_ALG)
    if type(alg) is not int or alg not in _ALG_NAMES:  # -7.0 == -7 and True == 1 in Python: the type first
        seen = "absent" if HDR_ALG not in sign1.headers else describe(alg)
        raise CoseError(f"{FIELD} protected header alg (label 1)", f"{seen}, expected -7 (ES256) or -8 (EdDSA)")
    kid = sign1.headers.get(HDR_KID, sign1.unprotected.get(HDR_KID))
    if not isinstance(kid, bytes):
        seen = "absent" if kid is None else describe(kid)
        raise CoseError(f"{FIELD} kid (label 4)", f"{seen}, expected a byte string naming the producer key")
    if kid not in public_keys:
        raise CoseError(f"{FIELD} kid (label 4)", f"{show(kid)} is not a known producer key")
    key = load_public_key(public_keys[kid])
    tbs = _to_be_signed(sign1.protected, sign1.payload)
    signature = sign1.signature
    try:
        if len(signature) != 64:  # r || s of P-256, or an Ed25519 signature
            raise InvalidSignature
        if alg == ALGORITHMS["ES256"]:
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise InvalidSignature
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            key.verify(der, tbs, ec.ECDSA(hashes.SHA256()))
        else:
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise InvalidSignature
            key.verify(signature, tbs)
    except InvalidSignature:
        raise CoseError(f"{FIELD} signature", f"the {_ALG_NAMES[alg]} signature of {len(signature)} octets does "
                        f"not verify with producer key {show(kid)}") from None
    return sign1.payload
