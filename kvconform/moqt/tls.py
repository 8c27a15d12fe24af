"""TLS material for MOQT over QUIC (profile §1): a self-signed test certificate, generated once per process.

QUIC needs TLS 1.3 even on loopback. Reference servers use `test_certificate()`; clients do not verify by
default (a harness talks to whatever it is pointed at) but can pin this certificate (or any PEM) as the
only trust anchor with `pin_certificate`.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aioquic.quic.configuration import QuicConfiguration
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

# Names the test certificate is valid for: what a loopback client dials.
TEST_NAMES = ("localhost",)
TEST_ADDRESSES = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class TestCertificate:
    """A certificate and its private key, as objects (for aioquic) and PEM (for pinning and files)."""

    __test__ = False  # not a pytest test class despite the name

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    @property
    def certificate_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization  # lazy: cryptography only once TLS is in use

        return self.certificate.public_bytes(serialization.Encoding.PEM)

    @property
    def private_key_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization  # lazy: cryptography only once TLS is in use

        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    @property
    def sha256(self) -> str:
        """Hex SHA-256 fingerprint of the DER certificate (for logs and evidence)."""
        from cryptography.hazmat.primitives import hashes  # lazy: cryptography only once TLS is in use

        return self.certificate.fingerprint(hashes.SHA256()).hex()


@functools.cache
def test_certificate() -> TestCertificate:
    """The process-wide self-signed certificate for localhost/127.0.0.1/::1 (P-256, valid 30 days)."""
    from cryptography.hazmat.primitives import hashes  # lazy: tens of ms of a MOQT run's start, maybe without TLS
    from cryptography.hazmat.primitives.asymmetric import ec  # lazy: see above

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = _self_signed(key, "kvconform MOQT test", now - datetime.timedelta(minutes=5),  # tolerate clock skew
                        now + datetime.timedelta(days=30), hashes.SHA256())
    return TestCertificate(cert, key)


test_certificate.__test__ = False  # type: ignore[attr-defined]  # a factory, not a pytest test


@functools.cache
def fixed_size_certificate() -> TestCertificate:
    """A certificate whose handshake bytes have the same length every time (the deterministic transport's,
    `kvconform.moqt.simnet`): Ed25519 (signatures always 64 bytes, where ECDSA's DER varies by a byte or two and
    so would the packets, aioquic's pacing and every timer after it), a fixed serial number and fixed dates."""
    from cryptography.hazmat.primitives.asymmetric import ed25519  # lazy: see test_certificate

    key = ed25519.Ed25519PrivateKey.generate()
    cert = _self_signed(key, "kvconform MOQT simulated", datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
                        datetime.datetime(2036, 1, 1, tzinfo=datetime.UTC), None, serial=0x4B56_434F_4E46_4F52_4D)
    return TestCertificate(cert, key)  # type: ignore[arg-type]  # an Ed25519 key where the field says EC


def _self_signed(key: Any, common_name: str, not_before: datetime.datetime, not_after: datetime.datetime,
                 digest: Any, serial: int | None = None) -> x509.Certificate:
    """A certificate for TEST_NAMES and TEST_ADDRESSES signed by ``key`` itself (a random serial number unless
    given); pinned as its own trust anchor, so it must be acceptable as a CA."""
    from cryptography import x509  # lazy: see test_certificate
    from cryptography.x509.oid import NameOID  # lazy: see test_certificate

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in TEST_NAMES]
    alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in TEST_ADDRESSES]
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number() if serial is None else serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, digest)
    )


def install_server_certificate(configuration: QuicConfiguration, cert: TestCertificate | None = None) -> None:
    """Give a server configuration its certificate and key (the process test certificate by default)."""
    cert = cert or test_certificate()
    configuration.certificate = cert.certificate
    configuration.private_key = cert.private_key


def pin_certificate(configuration: QuicConfiguration, pem: bytes | None = None) -> None:
    """Make a client verify the server against exactly `pem` (default: the process test certificate)."""
    configuration.verify_mode = ssl.CERT_REQUIRED
    configuration.cadata = pem if pem is not None else test_certificate().certificate_pem


def skip_verification(configuration: QuicConfiguration) -> None:
    """Client default: accept any server certificate (a conformance harness dials untrusted targets)."""
    configuration.verify_mode = ssl.CERT_NONE
