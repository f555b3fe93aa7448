"""`kop admin clusters` and the replication-clusters policy against a real broker started with `--cluster-name`:
the registry round-trips and survives a restart, bad input is refused with Pulsar's statuses, the policy resolves
topic > namespace, and a remote that does not speak kop's replication protocol is refused with the reason, shown
in the topic's stats."""
import json
import socket
import threading

import pytest

from integration.broker_process import BrokerProcess
from integration.geo import topic_stats, wait_for
from integration.idem_raw import RawKafka, plain_batch
from integration.test_admin import admin_change, admin_fails, admin_json, http
from protocol.errors import ErrorCode


@pytest.fixture
def east(tmp_path):
    broker = BrokerProcess(str(tmp_path / "east"), admin_port=0, options=("--cluster-name", "east")).start()
    yield broker
    broker.stop()


def test_clusters_registry_round_trips_and_survives_restart(east):
    assert admin_json(east, "clusters", "list") == []
    admin_json(east, "clusters", "create", "west", "--broker-url", "127.0.0.1:19092",
               "--admin-url", "http://127.0.0.1:18080")
    admin_json(east, "clusters", "create", "north", "--broker-url", "localhost:29092")
    assert admin_json(east, "clusters", "list") == ["north", "west"]
    admin_json(east, "clusters", "update", "west", "--broker-url", "127.0.0.1:19093")
    assert admin_json(east, "clusters", "get", "west") == {"name": "west", "brokerServiceUrl": "127.0.0.1:19093",
                                                            "serviceUrl": "", "securityProtocol": "PLAINTEXT"}
    admin_json(east, "clusters", "delete", "north")
    east.restart()
    assert admin_json(east, "clusters", "list") == ["west"]


def test_clusters_bad_input_is_refused(east):
    admin_json(east, "clusters", "create", "west", "--broker-url", "127.0.0.1:19092")
    assert "already exists" in admin_fails(east, "clusters", "create", "west", "--broker-url", "127.0.0.1:1",
                                           status=409)
    admin_fails(east, "clusters", "update", "south", "--broker-url", "127.0.0.1:1", status=404)
    admin_fails(east, "clusters", "delete", "south", status=404)
    admin_fails(east, "clusters", "get", "south", status=404)
    assert "HOST:PORT" in admin_fails(east, "clusters", "create", "x", "--broker-url", "nohost", status=400)
    admin_fails(east, "clusters", "create", "x", "--broker-url", "0.0.0.0:9092", status=400)
    assert "invalid cluster name" in admin_fails(east, "clusters", "create", "bad/name", "--broker-url",
                                                   "127.0.0.1:1", status=400)
    status, body = http(east, "PUT", "/admin/v2/clusters/x", b'{"brokerServiceUrl": 5}')
    assert status == 400 and "brokerServiceUrl" in body["reason"]
    for security, reason in (({"securityProtocol": "SASL"}, "unknown security protocol"),
                             ({"securityProtocol": "SASL_SSL", "saslUsername": "u", "saslPassword": "p"},
                              "needs a SASL mechanism"),
                             ({"securityProtocol": "SASL_PLAINTEXT", "saslMechanism": "PLAIN"},
                              "user name and password"),
                             ({"saslMechanism": "PLAIN"}, "SASL settings given with PLAINTEXT"),
                             ({"securityProtocol": "SSL", "sslCaFile": "/nonexistent/ca.pem"}, "cannot be read"),
                             ({"sslCaFile": "/etc/hostname"}, "CA file given with PLAINTEXT")):
        body = json.dumps({"brokerServiceUrl": "127.0.0.1:1", **security}).encode()
        status, answer = http(east, "PUT", "/admin/v2/clusters/x", body)
        assert status == 400 and reason in answer["reason"], (security, answer)
    status, body = http(east, "POST", "/admin/v2/namespaces/public/default/replication", b'["ok", "no/slash"]')
    assert status == 400


@pytest.mark.slow  # restarts and moves between brokers: 20-30 s in a loaded make test
def test_replication_clusters_policy_resolves_topic_over_namespace(east):
    with RawKafka(east.port) as kafka:
        assert kafka.create_topic("orders", 1) == ErrorCode.NONE
    assert admin_json(east, "namespaces", "get-clusters", "public/default") is None
    assert "null -> [\"east\", \"west\"]" in admin_change(east, "namespaces", "set-clusters", "public/default",
                                                          "--clusters", "east,west")
    admin_change(east, "topics", "set-clusters", "orders", "--clusters", "east")
    assert admin_json(east, "topics", "get-clusters", "orders", "--applied") == ["east"]
    admin_change(east, "topics", "remove-clusters", "orders")
    assert admin_json(east, "topics", "get-clusters", "orders", "--applied") == ["east", "west"]
    east.restart()
    assert admin_json(east, "namespaces", "get-clusters", "public/default") == ["east", "west"]


@pytest.mark.slow  # ~21 s: two clusters and three TTL levels
def test_message_ttl_policy_resolves_topic_over_namespace_over_broker(tmp_path):
    broker = BrokerProcess(str(tmp_path / "east"), admin_port=0, options=("--cluster-name", "east"),
                           config={"ttlDurationDefaultInSeconds": "7200"}).start()
    try:
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("orders", 1) == ErrorCode.NONE
        assert admin_json(broker, "topics", "get-message-ttl", "orders", "--applied") == 7200  # the broker's
        admin_change(broker, "namespaces", "set-message-ttl", "public/default", "--ttl", "3600")
        assert admin_json(broker, "topics", "get-message-ttl", "orders", "--applied") == 3600
        admin_change(broker, "topics", "set-message-ttl", "orders", "--ttl", "0")  # this topic never expires
        assert admin_json(broker, "topics", "get-message-ttl", "orders", "--applied") == 0
        assert "must be in 0..2147483647" in admin_fails(broker, "topics", "set-message-ttl", "orders", "--ttl", "-1",
                                                       status=400)
        broker.restart()
        assert admin_json(broker, "topics", "get-message-ttl", "orders") == 0
        assert admin_json(broker, "namespaces", "get-message-ttl", "public/default") == 3600
    finally:
        broker.stop()


def _old_broker() -> tuple[socket.socket, threading.Thread]:
    """A listener that answers ApiVersions the way a broker without kop's replication API does (Kafka's keys only),
    then closes: the remote end of a replication link, not the system under test."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                size = int.from_bytes(conn.recv(4), "big")
                frame = b""
                while len(frame) < size:
                    frame += conn.recv(size - len(frame))
                correlation_id = int.from_bytes(frame[4:8], "big")
                cls = ApiVersionsResponse[0]
                answer = cls(error_code=0, api_keys=[cls.ApiVersion(api_key=0, min_version=3, max_version=9),
                                                     cls.ApiVersion(api_key=18, min_version=0, max_version=3)])
                answer.with_header(correlation_id=correlation_id)
                conn.sendall(bytes(answer.encode(header=True, framed=True)))
                assert ApiVersionsRequest.API_KEY == int.from_bytes(frame[0:2], "big")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_remote_without_the_replication_api_is_refused_with_the_reason(east):
    server, thread = _old_broker()
    try:
        admin_json(east, "clusters", "create", "old", "--broker-url", f"127.0.0.1:{server.getsockname()[1]}")
        admin_change(east, "namespaces", "set-clusters", "public/default", "--clusters", "east,old")
        with RawKafka(east.port) as kafka:
            assert kafka.create_topic("orders", 1) == ErrorCode.NONE
            assert kafka.produce("orders", 0, plain_batch([b"one"])).error_code == ErrorCode.NONE
        wait_for(lambda: topic_stats(east, "orders")["replication"].get("old", {}).get("lastError"), 20,
                 "the replicator's error")
        stats = topic_stats(east, "orders")["replication"]["old"]
        assert "does not speak kop's replication protocol" in stats["lastError"]
        assert stats["connected"] is False and stats["replicationBacklog"] == 1
    finally:
        server.close()
        thread.join(5)


def test_entries_from_a_cluster_the_target_does_not_know_are_refused(tmp_path):
    east = BrokerProcess(str(tmp_path / "e"), admin_port=0, options=("--cluster-name", "east")).start()
    west = BrokerProcess(str(tmp_path / "w"), admin_port=0, options=("--cluster-name", "west")).start()
    try:
        admin_json(east, "clusters", "create", "west", "--broker-url", west.bootstrap)  # west does not know east
        admin_change(east, "namespaces", "set-clusters", "public/default", "--clusters", "east,west")
        with RawKafka(east.port) as kafka:
            assert kafka.create_topic("orders", 1) == ErrorCode.NONE
            assert kafka.produce("orders", 0, plain_batch([b"one"])).error_code == ErrorCode.NONE
        wait_for(lambda: topic_stats(east, "orders")["replication"].get("west", {}).get("lastError"), 20, "the refusal")
        assert "'east' is not in this cluster's registry" in topic_stats(east, "orders")["replication"]["west"][
            "lastError"]
        admin_json(west, "clusters", "create", "east", "--broker-url", east.bootstrap)
        wait_for(lambda: topic_stats(east, "orders")["replication"]["west"]["replicationBacklog"] == 0, 20,
                 "replication once west knows east")
    finally:
        east.stop()
        west.stop()


def test_bad_replicated_entries_are_refused_and_the_broker_goes_on(east):
    """A ReplicateEntries request with a damaged entry: that partition answers CORRUPT_MESSAGE, nothing of it is
    stored, and the broker serves on."""
    from protocol.replication import ReplicateEntriesRequest as Request, ReplicateEntriesResponse

    admin_json(east, "clusters", "create", "west", "--broker-url", "127.0.0.1:1")
    good = Request.ReplicateTopic.ReplicatePartition.ReplicateEntry(ledger_id=1, entry_id=0, metadata=b"",
                                                                    records=plain_batch([b"ok"]))
    cases = [good.__class__(ledger_id=1, entry_id=1, metadata=b"\xff\xff", records=plain_batch([b"x"])),
             good.__class__(ledger_id=1, entry_id=2, metadata=b"", records=b"not a batch"),
             good.__class__(ledger_id=-5, entry_id=0, metadata=b"", records=plain_batch([b"x"]))]
    with RawKafka(east.port) as kafka:
        for bad in cases:
            request = Request[0](source_cluster="west", target_cluster="east", timeout_ms=5000, topics=[
                Request.ReplicateTopic(name="in", partition_count=1, partitions=[
                    Request.ReplicateTopic.ReplicatePartition(partition_index=0, entries=[good, bad])])])
            answer = kafka.call(request, ReplicateEntriesResponse, 0).topics[0].partitions[0]
            assert (answer.error_code, answer.stored) == (ErrorCode.CORRUPT_MESSAGE, 1), answer
        assert kafka.end_offsets("in", [0]) == {0: 1}  # the good entry, once
        request = Request[0](source_cluster="west", target_cluster="north", timeout_ms=5000, topics=[])
        answer = kafka.call(request, ReplicateEntriesResponse, 0)
        assert answer.error_code == ErrorCode.INVALID_REQUEST and "not 'north'" in answer.error_message


@pytest.mark.parametrize("everyone_allowed", [False, True])
def test_replication_needs_cluster_action_when_an_authorizer_runs(tmp_path, everyone_allowed):
    """Replicating acts for a whole cluster: with the authorizer on, a principal without CLUSTER_ACTION on the
    cluster is refused before anything is looked at (control: allowed, the request reaches the registry check)."""
    from protocol.replication import ReplicateEntriesRequest as Request, ReplicateEntriesResponse
    broker = BrokerProcess(str(tmp_path / "data"), options=("--cluster-name", "east"),
                           config={"authorizer.enabled": "true",
                                   "allow.everyone.if.no.acl.found": str(everyone_allowed).lower()}).start()
    try:
        with RawKafka(broker.port) as kafka:
            request = Request[0](source_cluster="west", target_cluster="east", timeout_ms=5000, topics=[])
            answer = kafka.call(request, ReplicateEntriesResponse, 0)
        expected = ErrorCode.INVALID_REQUEST if everyone_allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert answer.error_code == expected, answer
    finally:
        broker.stop()
