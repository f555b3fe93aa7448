"""The admin REST API authenticates (HTTP Basic with the broker's users, or the admin token) and authorizes (DESCRIBE
on the cluster to read, ALTER to change); the probes stay open for orchestrators."""
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

from integration.broker_process import REPO
from integration.test_security_sasl import ADMIN, ADMIN_PASSWORD, PASSWORD, USER, SaslBroker

TOKEN = "a-long-random-admin-token"


def call(broker, path, method="GET", body=None, authorization=None) -> tuple[int, dict, dict]:
    request = urllib.request.Request(broker.process.admin_url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def basic(user, password) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    broker = SaslBroker(str(tmp_path_factory.mktemp("admin-auth")), **{
        "admin.authentication.enabled": "true", "admin.token": TOKEN, "authorizer.enabled": "true"}).start()
    yield broker
    broker.process.stop()


def test_the_token_bootstraps_users_and_nothing_else_passes_without_credentials(broker):
    assert call(broker, "/health")[0] == 200  # probes stay open
    status, headers, answer = call(broker, "/admin/v2/users")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert call(broker, "/admin/v2/users", authorization="Bearer wrong")[0] == 401
    # Basic credentials that are not even ASCII (HTTP carries latin-1): a 401 as any malformed ones (was a 500)
    assert call(broker, "/admin/v2/users", authorization="Basic \xff\xbdnot-ascii")[0] == 401
    for user, password in ((ADMIN, ADMIN_PASSWORD), (USER, PASSWORD)):
        status, _, _ = call(broker, f"/admin/v2/users/{user}", "POST", {"password": password},
                            authorization=f"Bearer {TOKEN}")
        assert status == 200
    status, _, users = call(broker, "/admin/v2/users", authorization=basic(ADMIN, ADMIN_PASSWORD))
    assert status == 200 and set(users) == {ADMIN, USER}
    assert call(broker, "/admin/v2/users", authorization=basic(ADMIN, "wrong"))[0] == 401


def test_users_need_describe_to_read_and_alter_to_change(broker):
    call(broker, f"/admin/v2/users/{USER}", "POST", {"password": PASSWORD}, authorization=f"Bearer {TOKEN}")
    call(broker, f"/admin/v2/users/{ADMIN}", "POST", {"password": ADMIN_PASSWORD}, authorization=f"Bearer {TOKEN}")
    alice = basic(USER, PASSWORD)
    assert call(broker, "/admin/v2/users", authorization=alice)[0] == 403
    from confluent_kafka.admin import AdminClient
    admin = AdminClient({"bootstrap.servers": broker.bootstrap("SASL_SSL"),
                         **broker.security("SASL_SSL", "SCRAM-SHA-256", ADMIN, ADMIN_PASSWORD).confluent()})
    describe = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{USER}", "*",
                          AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    for future in admin.create_acls([describe]).values():
        future.result(10)
    assert call(broker, "/admin/v2/users", authorization=alice)[0] == 200
    status, _, answer = call(broker, "/admin/v2/users/mallory", "POST", {"password": "x"}, authorization=alice)
    assert status == 403 and "ALTER" in answer["reason"]


def test_kop_admin_sends_the_users_credentials(broker):
    call(broker, f"/admin/v2/users/{ADMIN}", "POST", {"password": ADMIN_PASSWORD}, authorization=f"Bearer {TOKEN}")
    command = [sys.executable, "-m", "kop.cli", "admin", "--admin-url", broker.process.admin_url, "users", "list"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KOP_ADMIN")}
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 1 and "credentials required" in refused.stderr
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**env, "KOP_ADMIN_USER": ADMIN, "KOP_ADMIN_PASSWORD": ADMIN_PASSWORD})
    assert done.returncode == 0, done.stderr
    assert ADMIN in json.loads(done.stdout)
