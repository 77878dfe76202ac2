"""A throw-away certificate authority for the TLS tests: a CA, a server certificate for
127.0.0.1 and localhost, and client certificates, written as PEM files (``cryptography``)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_FOR = datetime.timedelta(days=2)


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that signs the certificates it is asked for; ``cert`` is the bundle clients trust."""

    cert: Path
    key: Path
    _certificate: x509.Certificate
    _private_key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, folder: Path, name: str = "percolake test CA") -> Authority:
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = _name(name)
        now = _now()
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        slug = name.replace(" ", "-")
        cert_path, key_path = folder / f"{slug}.crt", folder / f"{slug}.key"
        _write(cert_path, key_path, certificate, key)
        return cls(cert_path, key_path, certificate, key)

    def server(self, folder: Path, name: str = "server",
               hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Pem:
        """A server certificate valid for ``hosts`` (IP addresses and DNS names)."""
        alternative: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alternative.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alternative.append(x509.DNSName(host))
        return self._issue(folder, name, x509.SubjectAlternativeName(alternative),
                           ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, folder: Path, name: str, subject: x509.Name | None = None) -> Pem:
        """A client certificate whose subject common name is ``name``; with ``subject`` that
        whole subject instead (``name`` then only names the files)."""
        return self._issue(folder, name, None, ExtendedKeyUsageOID.CLIENT_AUTH, subject)

    def _issue(self, folder: Path, name: str, alternative: x509.SubjectAlternativeName | None,
               usage: x509.ObjectIdentifier, subject: x509.Name | None = None) -> Pem:
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject or _name(name)).issuer_name(self._certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALID_FOR)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._private_key.public_key()), critical=False)
        )
        if alternative is not None:
            builder = builder.add_extension(alternative, critical=False)
        certificate = builder.sign(self._private_key, hashes.SHA256())
        pem = Pem(folder / f"{name}.crt", folder / f"{name}.key")
        _write(pem.cert, pem.key, certificate, key)
        return pem


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write(cert_path: Path, key_path: Path, certificate: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> None:
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
