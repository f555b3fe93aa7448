"""The `ssl` pass: kop with an SSL listener that requires client certificates, and the test clients set up as trivup
sets up librdkafka's suite for `--ssl`: test.conf points at a CA, a client certificate and key, and the `SSL_*`
environment variables name the same material in every encoding the tests load (PEM, DER, PKCS#12).

The certificates are the integration tests' (integration/certificates.py: a CA, the broker's certificate for
127.0.0.1, a client certificate the CA signed); this module only writes them in the other encodings.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from integration.certificates import Certificates, make_certificates

KEYSTORE_PASSWORD = "librdkafka-tests-keystore"
# The suite's tests that need an SSL listener and trivup's SSL_* variables (they skip themselves without them)
SSL_TESTS = frozenset({"0097_ssl_verify"})


@dataclass(frozen=True)
class SslAccess:
    """How the `ssl` pass's clients reach the broker: its SSL listener, with a client certificate (mTLS); the
    kafka-topics.sh and kafka-acls.sh shims keep the plaintext listener."""

    port: int
    directory: Path
    certificates: Certificates

    @classmethod
    def create(cls, port: int, directory: Path) -> "SslAccess":
        access = cls(port, directory, make_certificates(str(directory)))
        access._write_encodings()
        return access

    def broker_properties(self) -> dict[str, str]:
        return {"listeners": f"PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:{self.port}",
                "ssl.keystore.location": self.certificates.broker,
                "ssl.truststore.location": self.certificates.ca, "ssl.client.auth": "required"}

    def client_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}", "security.protocol": "SSL",
                "ssl.ca.location": self.certificates.ca,
                "ssl.certificate.location": self.certificates.client_cert,
                "ssl.key.location": self.certificates.client_key, "ssl.key.password": KEYSTORE_PASSWORD}

    def env(self) -> dict[str, str]:
        """trivup's names (0097_ssl_verify reads them); the PEM key is not encrypted, so the password only opens
        the PKCS#12 keystore. No SSL_intermediate_*: the client certificate is signed by the root CA itself."""
        return {"SSL_pkcs": str(self._path("client.p12")), "SSL_password": KEYSTORE_PASSWORD,
                "SSL_pub_pem": self.certificates.client_cert, "SSL_priv_pem": self.certificates.client_key,
                "SSL_all_cas_pem": self.certificates.ca, "SSL_ca_pem": self.certificates.ca,
                "SSL_pub_der": str(self._path("client-cert.der")), "SSL_priv_der": str(self._path("client-key.der")),
                "SSL_ca_der": str(self._path("ca.der")), "SSL_client_auth": "required"}

    def _path(self, name: str) -> Path:
        return self.directory / name

    def _write_encodings(self) -> None:
        ca = x509.load_pem_x509_certificate(Path(self.certificates.ca).read_bytes())
        cert = x509.load_pem_x509_certificate(Path(self.certificates.client_cert).read_bytes())
        key = serialization.load_pem_private_key(Path(self.certificates.client_key).read_bytes(), None)
        self._path("ca.der").write_bytes(ca.public_bytes(serialization.Encoding.DER))
        self._path("client-cert.der").write_bytes(cert.public_bytes(serialization.Encoding.DER))
        self._path("client-key.der").write_bytes(key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        # the client's key and certificate, and the CA the tests read back out of it as ssl.ca
        self._path("client.p12").write_bytes(pkcs12.serialize_key_and_certificates(
            b"client", key, cert, [ca], serialization.BestAvailableEncryption(KEYSTORE_PASSWORD.encode())))
