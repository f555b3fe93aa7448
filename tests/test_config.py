"""The configuration table: every setting's accepted values, the rules between settings, and the properties file
with Kafka's and Pulsar's keys (listeners, log.dirs, unit variants, precedence, typos)."""
import pytest

from kop.cli import build_config, build_parser
from kop.config import FIELDS, BrokerConfig, inter_broker_listener, listener_specs, parse_setting
from kop.config_checks import Range
from kop.config_file import read_properties, unknown_key_warnings


def test_the_defaults_are_valid_and_every_numeric_setting_declares_its_range():
    BrokerConfig()  # checked when made
    unranged = [name for name, f in FIELDS.items() if f.type is int and not isinstance(f.metadata["check"], Range)]
    assert unranged == []


@pytest.mark.parametrize("name, accepted, refused", [
    ("port", ["0", "9092", "65535"], ["-1", "65536", "99999"]),
    ("advertised_port", ["0", "65535"], ["-1", "70000"]),
    ("admin_port", ["-1", "0", "8080"], ["-2", "65536"]),
    ("message_max_bytes", ["1", "1048588"], ["0", "-5", "2147483648"]),
    ("num_partitions", ["1", "100"], ["0", "-1"]),
    ("node_id", ["0", "7"], ["-1"]),
    ("retention_ms", ["-1", "0", "604800000"], ["-2"]),
    ("retention_bytes", ["-1", "0", "1073741824"], ["-2"]),
    ("queued_max_request_bytes", ["-1", "1"], ["0", "-2"]),
    ("connections_max_idle_ms", ["1", "9223372036854775807"], ["0", "9223372036854775808"]),
    ("broker_deduplication_snapshot_interval_seconds", ["0", "120"], ["-1"]),
    ("fsync", ["true", "FALSE", "yes", "0"], ["maybe", ""]),
    ("host", ["127.0.0.1", "::1", "0.0.0.0", "kafka-1.example.com", "my_service"], ["", "a b", "http://x", "x:1"]),
    ("advertised_host", ["", "localhost", "10.0.0.1"], ["0.0.0.0", "::", "a b"]),
    ("namespace", ["public/default", "t1/ns-2"], ["public", "a/b/c", "/x"]),
    ("cluster_id", ["kop-standalone", "MkU3OEVBNTcwNTJENDM2Qk"], ["", "has space"]),
    ("group_consumer_assignors", ["uniform,range", "range", " range , uniform ",
                                  "org.apache.kafka.coordinator.group.assignor.RangeAssignor"],
     ["", "sticky", "range,range", "uniform,org.apache.kafka.coordinator.group.assignor.UniformAssignor"]),
    ("group_consumer_migration_policy", ["disabled", "upgrade", "downgrade", "bidirectional", "Bidirectional"],
     ["", "both", "up"]),
])
def test_each_setting_accepts_its_range_and_refuses_the_rest(name, accepted, refused):
    for raw in accepted:
        parse_setting(name, raw)
    for raw in refused:
        with pytest.raises(ValueError):
            parse_setting(name, raw)


def test_the_server_side_assignors_are_named_in_order_the_first_the_default():
    assert BrokerConfig().consumer_assignors == ("uniform", "range")  # Kafka 4's default list
    config = BrokerConfig(group_consumer_assignors="org.apache.kafka.coordinator.group.assignor.RangeAssignor")
    assert config.consumer_assignors == ("range",)
    with pytest.raises(ValueError, match=r"^group.consumer.assignors: 'sticky' is not one of uniform, range"):
        BrokerConfig(group_consumer_assignors="uniform,sticky")


def test_a_refused_value_says_what_is_accepted():
    with pytest.raises(ValueError, match=r"must be at least 1, got -5"):
        parse_setting("message_max_bytes", "-5")
    with pytest.raises(ValueError, match=r"at least 0, or -1 for no limit, got -2"):
        parse_setting("retention_ms", "-2")
    with pytest.raises(ValueError, match=r"not an integer: '1e3'"):
        parse_setting("port", "1e3")
    with pytest.raises(ValueError, match=r"^log.retention.ms: must be"):  # named by the key users know
        BrokerConfig(retention_ms=-3)
    with pytest.raises(ValueError, match=r"expected bool"):
        BrokerConfig(fsync="false")


@pytest.mark.parametrize("broken, fixed, message", [
    ({"num_partitions": 5, "max_partitions_per_topic": 4}, {"num_partitions": 4, "max_partitions_per_topic": 4},
     r"num.partitions \(5\) exceeds max.partitions.per.topic \(4\)"),
    ({"group_min_session_timeout_ms": 10, "group_max_session_timeout_ms": 5},
     {"group_min_session_timeout_ms": 5, "group_max_session_timeout_ms": 5}, "group.min.session.timeout.ms"),
    ({"host": "0.0.0.0"}, {"host": "0.0.0.0", "advertised_host": "kafka.example.com"}, "needs an advertised host"),
    ({"host": "::"}, {"host": "::", "advertised_host": "10.0.0.1"}, "needs an advertised host"),
])
def test_rules_between_settings(broken, fixed, message):
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**broken)
    BrokerConfig(**fixed)


def properties(tmp_path, text: str):
    path = tmp_path / "server.properties"
    path.write_text(text)
    return read_properties(str(path))


def test_kafka_listeners_and_log_dirs_set_where_kop_listens_and_keeps_its_data(tmp_path):
    values = properties(tmp_path, "listeners=PLAINTEXT://0.0.0.0:19092\n"
                                  "advertised.listeners=PLAINTEXT://kafka.example.com:29092\n"
                                  "log.dirs=/var/lib/kop\n").values
    assert values == {"host": "0.0.0.0", "port": 19092, "advertised_host": "kafka.example.com",
                      "advertised_port": 29092, "data_dir": "/var/lib/kop", "listeners": "PLAINTEXT://0.0.0.0:19092",
                      "advertised_listeners": "PLAINTEXT://kafka.example.com:29092"}
    # Kafka binds every interface for an empty host; v6 addresses are bracketed; the protocol's case is free.
    assert properties(tmp_path, "listeners=PLAINTEXT://:9092\n").values == {
        "host": "0.0.0.0", "port": 9092, "listeners": "PLAINTEXT://:9092"}
    assert properties(tmp_path, "listeners=plaintext://[::1]:9093\n").values == {
        "host": "::1", "port": 9093, "listeners": "plaintext://[::1]:9093"}
    assert properties(tmp_path, "advertised.listeners=PLAINTEXT://:9094\n").values == {
        "advertised_host": "", "advertised_port": 9094, "advertised_listeners": "PLAINTEXT://:9094"}


def test_several_listeners_each_with_its_security_protocol_and_advertised_address():
    config = BrokerConfig(listeners="CLIENT://127.0.0.1:19092,SECURE://:19093,SASL_PLAINTEXT://127.0.0.1:19094",
                          port=19092, advertised_listeners="SECURE://kafka.example.com:443",
                          listener_security_protocol_map="CLIENT:PLAINTEXT,SECURE:SASL_SSL",
                          ssl_keystore_location="/etc/kop/broker.pem")
    specs = {spec.name: spec for spec in listener_specs(config)}
    assert [(s.protocol, s.host, s.port, s.advertised_host, s.advertised_port) for s in specs.values()] == [
        ("PLAINTEXT", "127.0.0.1", 19092, "127.0.0.1", 0),
        ("SASL_SSL", "0.0.0.0", 19093, "kafka.example.com", 443),
        ("SASL_PLAINTEXT", "127.0.0.1", 19094, "127.0.0.1", 0)]
    assert specs["SECURE"].tls and specs["SECURE"].sasl and not specs["CLIENT"].tls
    assert inter_broker_listener(config, list(specs.values())).name == "CLIENT"  # by default, the first one


def test_the_brokers_of_a_cluster_reach_each_other_on_the_listener_named_for_it():
    config = BrokerConfig(listeners="SASL_PLAINTEXT://127.0.0.1:19092,INTERNAL://10.0.0.1:19093", port=19092,
                          listener_security_protocol_map="INTERNAL:PLAINTEXT", inter_broker_listener_name="INTERNAL")
    chosen = inter_broker_listener(config, listener_specs(config))
    assert (chosen.name, chosen.protocol, chosen.port) == ("INTERNAL", "PLAINTEXT", 19093)


@pytest.mark.parametrize("settings, message", [
    ({"listeners": "INTERNAL://:9093"}, "listener name INTERNAL has no security protocol"),
    ({"listeners": "SSL://127.0.0.1:9093"}, "needs ssl.keystore.location"),
    ({"listeners": "A://127.0.0.1:9093,B://127.0.0.1:9093",
      "port": 9093, "listener_security_protocol_map": "A:PLAINTEXT,B:SSL", "ssl_keystore_location": "k.pem"},
     "two listeners on one port"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://:9093", "ssl_keystore_location": "k.pem"},
     "listener SSL listens on every interface"),
    ({"listener_security_protocol_map": "A:TLS"}, "unknown security protocol 'TLS'"),
    ({"advertised_listeners": "SSL://example.com:9093"}, "advertised listener SSL is not in listeners"),
    ({"inter_broker_listener_name": "INTERNAL"}, "inter.broker.listener.name INTERNAL names no listener"),
])
def test_listener_lists_kop_cannot_serve_as_written_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**settings)


@pytest.mark.parametrize("line, message", [
    ("listeners=PLAINTEXT://:9092,plaintext://:9093", "listener name PLAINTEXT appears twice"),
    ("listeners=127.0.0.1:9092", "expected NAME://HOST:PORT"),
    ("listeners=PLAINTEXT://host", "expected HOST:PORT"),
    ("listeners=PLAINTEXT://:70000", "must be at most 65535"),
    ("advertised.listeners=PLAINTEXT://0.0.0.0:9092", "clients need an address"),
    ("log.dirs=/a,/b", "one directory, got 2"),
    ("log.dirs=", "one directory, got 0"),
    ("message.max.bytes=-5", "must be at least 1, got -5"),
    ("auto.create.topics.enable=sometimes", "not a boolean"),
    ("log.roll.hours=0", "must be at least 1"),
])
def test_a_value_kop_cannot_run_with_is_refused_naming_file_line_and_key(tmp_path, line, message):
    with pytest.raises(ValueError) as refused:
        properties(tmp_path, f"# kop\nnum.partitions=2\n{line}\n")
    key, _, raw = line.partition("=")
    assert str(refused.value).startswith(f"{tmp_path / 'server.properties'}:3: {key}={raw}: ")
    assert message in str(refused.value)


def test_unit_variants_follow_kafkas_precedence(tmp_path):
    assert properties(tmp_path, "log.retention.hours=24\n").values == {"retention_ms": 86_400_000}
    assert properties(tmp_path, "log.retention.hours=-1\n").values == {"retention_ms": -1}  # no limit
    assert properties(tmp_path, "log.roll.hours=1\n").values == {"ledger_max_age_ms": 3_600_000}
    # ms over minutes over hours, in any order, as in Kafka
    both = "log.retention.ms=5000\nlog.retention.minutes=2\nlog.retention.hours=168\n"
    assert properties(tmp_path, both).values == {"retention_ms": 5000}
    assert properties(tmp_path, "log.retention.hours=168\nlog.retention.minutes=2\n").values == {
        "retention_ms": 120_000}
    assert properties(tmp_path, "log.dirs=/a\nlog.dir=/b\n").values == {"data_dir": "/a"}
    assert properties(tmp_path, "log.dir=/b\n").values == {"data_dir": "/b"}


def test_keys_of_equal_standing_must_agree_and_a_repeated_key_takes_its_last_value(tmp_path):
    with pytest.raises(ValueError, match=r":2: node.id=1 contradicts line 1: broker.id=0"):
        properties(tmp_path, "broker.id=0\nnode.id=1\n")
    assert properties(tmp_path, "broker.id=3\nnode.id=3\n").values == {"node_id": 3}
    with pytest.raises(ValueError, match=r"log.dirs=/b contradicts line 1: data.dir=/a"):
        properties(tmp_path, "data.dir=/a\nlog.dirs=/b\n")
    # an appended override, the way container images configure Kafka
    assert properties(tmp_path, "num.partitions=1\nnum.partitions=6\n").values == {"num_partitions": 6}


def test_field_names_with_dots_or_underscores_and_declared_aliases_are_keys(tmp_path):
    values = properties(tmp_path, "retention_check_interval_ms=200\nmax.connections=10\n"
                                  "brokerDeduplicationEnabled=false\nwebServicePort=9191\nclusterName=c1\n").values
    assert values == {"retention_check_interval_ms": 200, "max_connections": 10,
                      "broker_deduplication_enabled": False, "admin_port": 9191, "cluster_name": "c1"}


# The keys of Kafka's stock KRaft server.properties and a Pulsar standalone.conf that kop does not implement:
# ignored with a warning, and not mistaken for typos of kop's keys.
FOREIGN_KEYS = """process.roles controller.quorum.voters controller.listener.names
num.network.threads num.io.threads socket.send.buffer.bytes socket.receive.buffer.bytes
num.recovery.threads.per.data.dir offsets.topic.replication.factor transaction.state.log.replication.factor
transaction.state.log.min.isr log.flush.interval.messages log.flush.interval.ms zookeeper.connect
zookeeper.connection.timeout.ms queued.max.requests default.replication.factor
min.insync.replicas offsets.retention.minutes log.cleanup.policy compression.type webServicePortTls
brokerServicePort managedLedgerMaxEntriesPerLedger brokerDeleteInactiveTopicsEnabled metadataStoreUrl""".split()


def test_unknown_keys_are_warned_about_with_a_suggestion_only_for_a_likely_typo(tmp_path):
    typos = {"num.partition": "num.partitions", "messages.max.bytes": "message.max.bytes",
             "auto.create.topic.enable": "auto.create.topics.enable", "brokerDeduplicationEnable":
             "brokerDeduplicationEnabled", "brokerdeduplicationenabled": "brokerDeduplicationEnabled",
             "fsycn": "fsync", "advertised.listener": "advertised.listeners", "log.retention.hour":
             "log.retention.hours"}
    text = "".join(f"{key}=1\n" for key in [*typos, *FOREIGN_KEYS])
    read = properties(tmp_path, text)
    assert read.values == {}
    assert read.unknown == {**typos, **{key: None for key in FOREIGN_KEYS}}
    warnings = unknown_key_warnings("server.properties", read)
    assert "server.properties: unknown key num.partition is ignored; did you mean num.partitions?" in warnings
    assert "server.properties: unknown key zookeeper.connect is ignored" in warnings


def test_an_unreadable_or_malformed_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read config file .*missing.properties: No such file"):
        read_properties(str(tmp_path / "missing.properties"))
    with pytest.raises(ValueError, match=r"cannot read config file .*: Is a directory"):
        read_properties(str(tmp_path))
    (tmp_path / "binary.properties").write_bytes(b"\xff\xfe\x00key=value")
    with pytest.raises(ValueError, match=r"is not UTF-8 text"):
        read_properties(str(tmp_path / "binary.properties"))
    with pytest.raises(ValueError, match=r":2: expected key=value, got 'num.partitions 3'"):
        properties(tmp_path, "! a Java properties comment\nnum.partitions 3\n")


def standalone(*argv: str):
    return build_config(build_parser().parse_args(["standalone", *argv]))


def test_the_command_line_overrides_the_file_and_is_checked_the_same_way(tmp_path):
    config = tmp_path / "server.properties"
    config.write_text("listeners=PLAINTEXT://127.0.0.2:9092\nlog.dirs=/from/file\nnum.partitions=3\n")
    got = standalone("--config", str(config), "--listen", "[::1]:9095", "--data-dir", str(tmp_path)).config
    assert (got.host, got.port, got.data_dir, got.num_partitions) == ("::1", 9095, str(tmp_path), 3)
    assert (standalone("--listen", ":9096").config.host, standalone("--listen", ":9096").config.port) == (
        "127.0.0.1", 9096)
    config.write_text("listeners=PLAINTEXT://0.0.0.0:9092\n")
    with pytest.raises(ValueError, match="needs an advertised host"):
        standalone("--config", str(config))
    assert standalone("--config", str(config), "--advertised-host", "kafka.example.com").config.advertised == (
        "kafka.example.com")
