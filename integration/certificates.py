"""Test certificates made with `cryptography`: a CA, the broker's certificate (for 127.0.0.1 and localhost), a client
certificate the CA signed (mTLS) and one from another CA, written as PEM files the broker and every client read."""
import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CLIENT_SUBJECT = "CN=alice,OU=testing,O=kop"  # RFC 2253: most specific first


@dataclass(frozen=True)
class Certificates:
    ca: str  # the CA certificate (PEM)
    broker: str  # the broker's certificate chain and key (ssl.keystore.location)
    client_cert: str
    client_key: str
    client: str  # client_cert and client_key in one file (the Java client's PEM keystore)
    stranger_cert: str  # a client certificate from a CA the broker does not trust
    stranger_key: str


def _name(**attributes: str) -> x509.Name:
    oids = {"C": NameOID.COUNTRY_NAME, "O": NameOID.ORGANIZATION_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME,
            "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[key], value) for key, value in attributes.items()])


def _issue(subject: x509.Name, key, issuer: x509.Name, issuer_key, *, ca: bool = False,
           hosts: tuple[str, ...] = ()) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        names = [x509.IPAddress(ipaddress.ip_address(h)) if h[0].isdigit() else x509.DNSName(h) for h in hosts]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: str, *parts: bytes) -> str:
    with open(path, "wb") as f:
        f.write(b"".join(parts))
    return path


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(directory: str) -> Certificates:
    os.makedirs(directory, exist_ok=True)
    path = lambda name: os.path.join(directory, name)  # noqa: E731
    ca_key, other_ca_key, broker_key, client_key, stranger_key = (ec.generate_private_key(ec.SECP256R1())
                                                                   for _ in range(5))
    ca_name, other_ca_name = _name(O="kop", CN="kop test CA"), _name(O="elsewhere", CN="another CA")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    broker = _issue(_name(O="kop", CN="broker"), broker_key, ca_name, ca_key, hosts=("127.0.0.1", "localhost"))
    client = _issue(_name(O="kop", OU="testing", CN="alice"), client_key, ca_name, ca_key)
    stranger = _issue(_name(O="elsewhere", CN="mallory"), stranger_key, other_ca_name, other_ca_key)
    return Certificates(
        ca=_write(path("ca.pem"), _pem(ca)),
        broker=_write(path("broker.pem"), _pem(broker), _key_pem(broker_key)),
        client_cert=_write(path("client-cert.pem"), _pem(client)),
        client_key=_write(path("client-key.pem"), _key_pem(client_key)),
        client=_write(path("client.pem"), _pem(client), _key_pem(client_key)),
        stranger_cert=_write(path("stranger-cert.pem"), _pem(stranger)),
        stranger_key=_write(path("stranger-key.pem"), _key_pem(stranger_key)))
