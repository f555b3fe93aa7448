"""The TLS server context and the principal of a client certificate, over a real TLS handshake in memory."""
import dataclasses
import ssl

import pytest

from integration.certificates import CLIENT_SUBJECT, make_certificates
from kop.security.tls import TlsSettings, escape, server_context, subject_name


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> ssl.SSLObject:
    """Run a handshake between two in-memory TLS ends; returns the server's end."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(client_in, client_out, server_hostname="localhost")
    for _ in range(10):
        done = 0
        for end in (client_end, server_end):
            try:
                end.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        to_server.write(client_out.read())
        client_in.write(to_client.read())
        if done == 2:
            return server_end
    raise AssertionError("handshake did not finish")


def test_the_principal_of_a_client_certificate_is_its_subject_most_specific_first(tmp_path):
    certs = make_certificates(str(tmp_path))
    server = server_context(TlsSettings(certs.broker, "", certs.ca, "required"))
    client = ssl.create_default_context(cafile=certs.ca)
    client.load_cert_chain(certs.client_cert, certs.client_key)
    assert subject_name(handshake(server, client).getpeercert()) == CLIENT_SUBJECT == "CN=alice,OU=testing,O=kop"


def test_rfc2253_special_characters_are_escaped():
    assert escape('a,b+c"d\\e<f>g;h=i') == 'a\\,b\\+c\\"d\\\\e\\<f\\>g\\;h\\=i'
    assert escape(" lead") == "\\ lead" and escape("#x") == "\\#x" and escape("trail ") == "trail\\ "
    assert subject_name({"subject": ((("countryName", "DE"),), (("commonName", "x,y"), ("userId", "7")))}) == \
        "CN=x\\,y+UID=7,C=DE"


@pytest.mark.parametrize("settings, message", [
    (TlsSettings("/nonexistent.pem", "", "", "none"), "ssl.keystore.location /nonexistent.pem"),
    (TlsSettings("BROKER", "", "", "required"), "needs ssl.truststore.location"),
    (TlsSettings("BROKER", "", "/nonexistent-ca.pem", "required"), "ssl.truststore.location /nonexistent-ca.pem"),
])
def test_unusable_tls_files_are_named(tmp_path, settings, message):
    broker = make_certificates(str(tmp_path)).broker
    if settings.keystore == "BROKER":
        settings = dataclasses.replace(settings, keystore=broker)
    with pytest.raises(ValueError, match=message):
        server_context(settings)
