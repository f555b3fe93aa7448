"""How each client library is configured for a listener's security protocol: TLS trusting the test CA, optionally with
a client certificate, and SASL with a mechanism, user and password. One ClientSecurity yields every client's form."""
from dataclasses import dataclass

from integration.certificates import Certificates


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    certificates: Certificates | None = None
    client_certificate: bool = False  # present the client certificate (mTLS)
    mechanism: str = ""
    user: str = ""
    password: str = ""

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    def confluent(self) -> dict:
        config = {"security.protocol": self.protocol}
        if self.tls:
            config["ssl.ca.location"] = self.certificates.ca
            if self.client_certificate:
                config |= {"ssl.certificate.location": self.certificates.client_cert,
                           "ssl.key.location": self.certificates.client_key}
        if self.sasl:
            config |= {"sasl.mechanism": self.mechanism, "sasl.username": self.user, "sasl.password": self.password}
        return config

    def kafka_python(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.tls:
            config["ssl_cafile"] = self.certificates.ca
            if self.client_certificate:
                config |= {"ssl_certfile": self.certificates.client_cert, "ssl_keyfile": self.certificates.client_key}
        if self.sasl:
            config |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                       "sasl_plain_password": self.password}
        return config

    def aiokafka(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.tls:
            from aiokafka.helpers import create_ssl_context
            certificate = ({"certfile": self.certificates.client_cert, "keyfile": self.certificates.client_key}
                           if self.client_certificate else {})
            config["ssl_context"] = create_ssl_context(cafile=self.certificates.ca, **certificate)
        if self.sasl:
            config |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                       "sasl_plain_password": self.password}
        return config

    def java(self) -> dict:
        config = {"security.protocol": self.protocol}
        if self.tls:
            config |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.certificates.ca}
            if self.client_certificate:
                config |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": self.certificates.client}
        if self.sasl:
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if self.mechanism == "PLAIN" else
                      "org.apache.kafka.common.security.scram.ScramLoginModule")
            config |= {"sasl.mechanism": self.mechanism,
                       "sasl.jaas.config": f'{module} required username="{self.user}" password="{self.password}";'}
        return config
