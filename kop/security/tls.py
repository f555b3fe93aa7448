"""TLS for SSL and SASL_SSL listeners (stdlib ssl), configured with Kafka's keys in their PEM form, and the principal
of a client certificate (mTLS): its subject as an RFC 2253 name, as Kafka's default principal builder gives it."""
import ssl
from dataclasses import dataclass

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}

# RFC 2253 / 4514 short names of the attributes Python's getpeercert() spells out
SHORT_NAMES = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
               "localityName": "L", "stateOrProvinceName": "ST", "streetAddress": "STREET",
               "domainComponent": "DC", "userId": "UID"}


@dataclass(frozen=True)
class TlsSettings:
    keystore: str  # PEM: the certificate chain and its private key
    key_password: str
    truststore: str  # PEM CA certificates client certificates are checked against; "" for none
    client_auth: str  # none | requested | required


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """Raises ValueError naming the file that could not be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.keystore, None, settings.key_password or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl.keystore.location {settings.keystore}: {exc}") from None
    context.verify_mode = CLIENT_AUTH[settings.client_auth]
    if settings.truststore:
        try:
            context.load_verify_locations(cafile=settings.truststore)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"ssl.truststore.location {settings.truststore}: {exc}") from None
    elif settings.client_auth != "none":
        raise ValueError(f"ssl.client.auth={settings.client_auth} needs ssl.truststore.location")
    return context


def client_context(settings: TlsSettings, check_hostname: bool) -> ssl.SSLContext:
    """A broker's own TLS connections to the other brokers: their certificates checked against the truststore (the
    system's CAs without one) and, with check_hostname, against the host reached; this broker's certificate shown
    when asked for (a listener with ssl.client.auth). Raises ValueError naming the file that could not be used."""
    try:
        context = ssl.create_default_context(cafile=settings.truststore or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl.truststore.location {settings.truststore}: {exc}") from None
    context.check_hostname = check_hostname
    try:
        context.load_cert_chain(settings.keystore, None, settings.key_password or None)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl.keystore.location {settings.keystore}: {exc}") from None
    return context


def escape(value: str) -> str:
    escaped = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    return escaped[:-1] + "\\ " if escaped.endswith(" ") else escaped


def subject_name(certificate: dict) -> str:
    """getpeercert()'s subject as RFC 2253 writes it: most specific RDN first, e.g. `CN=alice,O=Example,C=DE`."""
    rdns = []
    for rdn in reversed(certificate.get("subject", ())):
        rdns.append("+".join(f"{SHORT_NAMES.get(key, key)}={escape(value)}" for key, value in rdn))
    return ",".join(rdns)
