"""How each client library is configured for a listener's security protocol: TLS trusting the test CA, optionally with
a client certificate, and SASL with a mechanism, user and password (or, for OAUTHBEARER, a token). One ClientSecurity
yields every client's form."""
import base64
import json
import time
from dataclasses import dataclass

from integration.certificates import Certificates


def unsecured_jwt(claims: dict, header: dict | None = None, signature: str = "") -> str:
    """An unsigned JWT (`alg: none`) with these claims, as a development OAUTHBEARER token."""
    encode = lambda part: base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{encode(header or {'alg': 'none'})}.{encode(claims)}.{signature}"


def token_for(user: str, lifetime_s: float = 3600, **claims) -> str:
    now = time.time()
    return unsecured_jwt({"sub": user, "iat": now, "exp": now + lifetime_s, **claims})


def _kafka_python_provider(token: str):
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self) -> str:
            return token
    return Provider()


def _aiokafka_provider(token: str):
    from aiokafka.abc import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        async def token(self) -> str:
            return token
    return Provider()


@dataclass(frozen=True)
class ClientSecurity:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    certificates: Certificates | None = None
    client_certificate: bool = False  # present the client certificate (mTLS)
    mechanism: str = ""
    user: str = ""
    password: str = ""
    token: str = ""  # OAUTHBEARER: the token sent; empty: an unsecured JWT for `user` (librdkafka makes its own)

    @property
    def oauth(self) -> bool:
        return self.mechanism == "OAUTHBEARER"

    @property
    def bearer(self) -> str:
        return self.token or token_for(self.user)

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
        if self.oauth and self.token:
            config |= {"sasl.mechanism": self.mechanism,  # librdkafka refuses a token it sees has expired
                       "oauth_cb": lambda _config: (self.token, time.time() + 3600)}
        elif self.oauth:
            config |= {"sasl.mechanism": self.mechanism, "enable.sasl.oauthbearer.unsecure.jwt": True,
                       "sasl.oauthbearer.config": f"principal={self.user}"}
        elif self.sasl:
            config |= {"sasl.mechanism": self.mechanism, "sasl.username": self.user, "sasl.password": self.password}
        return config

    def kafka_python(self) -> dict:
        config = {"security_protocol": self.protocol}
        if self.tls:
            config["ssl_cafile"] = self.certificates.ca
            if self.client_certificate:
                config |= {"ssl_certfile": self.certificates.client_cert, "ssl_keyfile": self.certificates.client_key}
        if self.oauth:
            config |= {"sasl_mechanism": self.mechanism,
                       "sasl_oauth_token_provider": _kafka_python_provider(self.bearer)}
        elif self.sasl:
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
        if self.oauth:
            config |= {"sasl_mechanism": self.mechanism, "sasl_oauth_token_provider": _aiokafka_provider(self.bearer)}
        elif self.sasl:
            config |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user,
                       "sasl_plain_password": self.password}
        return config

    def java(self) -> dict:
        config = {"security.protocol": self.protocol}
        if self.tls:
            config |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": self.certificates.ca}
            if self.client_certificate:
                config |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": self.certificates.client}
        if self.oauth:  # the Java client's own unsecured login makes the token
            module = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
            config |= {"sasl.mechanism": self.mechanism,
                       "sasl.jaas.config": f'{module} required unsecuredLoginStringClaim_sub="{self.user}";'}
        elif self.sasl:
            module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if self.mechanism == "PLAIN" else
                      "org.apache.kafka.common.security.scram.ScramLoginModule")
            config |= {"sasl.mechanism": self.mechanism,
                       "sasl.jaas.config": f'{module} required username="{self.user}" password="{self.password}";'}
        return config
