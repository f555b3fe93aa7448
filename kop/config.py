"""Broker configuration: every setting with its default and the values it accepts, in one table.

Each field's metadata holds its check (kop/config_checks.py) and the properties-file keys that set it besides its own
name with dots (`message_max_bytes` is `message.max.bytes`): Kafka's server.properties spelling where the concept is
Kafka's, Pulsar's broker.conf spelling where it is Pulsar's. A BrokerConfig is checked when it is made, so one that
exists holds only values the broker can run with; the properties file itself is read by kop/config_file.py.
"""
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from kop.config_checks import INT32_MAX, INT64_MAX, WILDCARD_HOSTS, HostName, ListOf, Matches, OneOf, Range
from kop.security.listeners import ListenerSpec, parse_protocol_map, resolve_listeners

Check = Callable[[Any], None]
# How a setting may change while the broker runs (Kafka's "update mode"): not at all; through AlterConfigs on this
# broker's resource only; or also through the cluster-wide default (the BROKER resource with an empty name).
READ_ONLY, PER_BROKER, CLUSTER_WIDE = "read-only", "per-broker", "cluster-wide"
PORT = Range(0, 65535)
SIZE = Range(1)  # bytes or a count: at least one
MILLIS = Range(1, INT64_MAX)
NAME = Matches(r"[\w.-]+", "letters, digits, '.', '_' or '-'")
# The server-side assignors of KIP-848 groups (kop/groups/consumer/assignors.py), by name or by Kafka's class name.
CONSUMER_ASSIGNORS = ListOf(("uniform", "range"), (
    ("org.apache.kafka.coordinator.group.assignor.UniformAssignor", "uniform"),
    ("org.apache.kafka.coordinator.group.assignor.RangeAssignor", "range")))


def setting(default: Any, check: Check | None = None, *keys: str, doc: str, update: str = READ_ONLY) -> Any:
    """A field with its check (None: any value of its type), the file keys that set it besides its own name, what
    it does (rendered into docs/operations.md by kop/reference.py), and its update mode: a field is dynamic (kop/
    dynamic) only where the running broker reads it again, or is told of its change, and acts on the new value."""
    return field(default=default, metadata={"check": check, "keys": keys, "doc": doc, "update": update})


@dataclass(frozen=True)
class BrokerConfig:
    # listener and identity
    host: str = setting("127.0.0.1", HostName(), doc="Interface Kafka clients connect to (also set by `listeners`).")
    port: int = setting(9092, PORT, doc="Kafka port (also set by `listeners`); 0 picks any free port.")
    advertised_host: str = setting("", HostName(empty_ok=True, wildcard_ok=False),
                                   doc="Host clients are told to connect to (also set by `advertised.listeners`); "
                                       "empty: the host listened on.")
    advertised_port: int = setting(0, PORT, doc="Port clients are told to connect to, e.g. a proxy's; 0: the port "
                                                "listened on.")
    listeners: str = setting("", None, doc="More listeners (Kafka's `listeners` list, `NAME://HOST:PORT,...`); the "
                                           "first one is `host`:`port`. Empty: one PLAINTEXT listener.")
    advertised_listeners: str = setting("", None, doc="What clients are told per listener name (Kafka's "
                                                      "`advertised.listeners`).")
    listener_security_protocol_map: str = setting(
        "", parse_protocol_map,
        doc="`NAME:PROTOCOL,...`: the security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) of each listener "
            "name that is not a protocol's own name.")
    # TLS (SSL and SASL_SSL listeners): Kafka's keys, PEM files
    ssl_keystore_location: str = setting("", None, doc="PEM file with the broker's certificate chain and private key.")
    ssl_key_password: str = setting("", None, doc="Password of the private key, if it is encrypted.")
    ssl_truststore_location: str = setting("", None, doc="PEM file of the CA certificates that client certificates "
                                                         "are checked against.")
    ssl_client_auth: str = setting("none", Matches("none|requested|required", "none, requested or required"),
                                   doc="Client certificates (mTLS): required, requested (checked when sent) or none. "
                                       "A client with a certificate is the principal `User:` + its subject.")
    ssl_handshake_timeout_ms: int = setting(10_000, MILLIS, doc="Close a connection whose TLS handshake takes longer.")
    # SASL (SASL_PLAINTEXT and SASL_SSL listeners)
    sasl_enabled_mechanisms: str = setting("PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                                           Matches(r"((PLAIN|SCRAM-SHA-256|SCRAM-SHA-512|OAUTHBEARER),?)+",
                                                   "a list of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER"),
                                           doc="The SASL mechanisms clients may use. OAUTHBEARER needs a token "
                                               "validator (`sasl.oauthbearer.unsecured.validator.enabled`).")
    # OAUTHBEARER: Kafka's unsecured JWT validator, for development (the JAAS option names are accepted as keys)
    sasl_oauthbearer_unsecured_validator_enabled: bool = setting(
        False, None, doc="Validate OAUTHBEARER tokens as unsigned JWTs (`alg: none`): development only, since any "
                         "client can then claim any principal.")
    sasl_oauthbearer_unsecured_validator_principal_claim_name: str = setting(
        "sub", NAME, "unsecuredValidatorPrincipalClaimName", doc="The token claim naming the principal.")
    sasl_oauthbearer_unsecured_validator_scope_claim_name: str = setting(
        "scope", NAME, "unsecuredValidatorScopeClaimName",
        doc="The token claim holding its scopes: a JSON array, or one string of space-separated scopes.")
    sasl_oauthbearer_unsecured_validator_required_scope: str = setting(
        "", None, "unsecuredValidatorRequiredScope", doc="Space-separated scopes every token must have.")
    sasl_oauthbearer_unsecured_validator_allowable_clock_skew_ms: int = setting(
        0, Range(0, INT32_MAX), "unsecuredValidatorAllowableClockSkewMs",
        doc="How far the broker's clock may disagree with a token's `exp` and `iat`.")
    connections_max_reauth_ms: int = setting(0, Range(0, INT64_MAX),
                                             doc="A SASL session lasts this long; the client must authenticate again "
                                                 "before it ends (KIP-368). 0: sessions do not expire.")
    connection_failed_authentication_delay_ms: int = setting(
        100, Range(0, INT32_MAX), doc="After a failed authentication is answered, wait this long before closing the "
                                      "connection.")
    sasl_server_max_receive_size: int = setting(524288, SIZE, doc="The largest request accepted before a client "
                                                                  "has authenticated.")
    super_users: str = setting("", None, doc="Principals allowed everything, `User:NAME;User:OTHER` (a client "
                                             "certificate's principal is `User:` + its subject).")
    authorizer_enabled: bool = setting(False, None, doc="Enforce ACLs on every request. Off: every client may do "
                                                        "everything, and the ACL requests answer SECURITY_DISABLED.")
    allow_everyone_if_no_acl_found: bool = setting(False, None, doc="With the authorizer on, allow what no ACL "
                                                                    "names at all (Kafka's key).")
    node_id: int = setting(1, Range(0), "node.id", "broker.id", doc="The broker id clients see in Metadata.")
    cluster_id: str = setting("kop-standalone", NAME, doc="The cluster id answered in Metadata and DescribeCluster.")
    cluster_name: str = setting("standalone", NAME, "clusterName",
                                doc="The name of the cluster this broker belongs to (geo-replication: "
                                    "what other clusters call it).")
    data_dir: str = setting("./data", Matches(r".+", "a directory"),
                            doc="Where everything is stored (also set by `log.dirs` or `log.dir`, one directory); "
                                "its parent must exist.")
    namespace: str = setting("public/default", Matches(r"[-=:.\w]+/[-=:.\w]+", "tenant/namespace"),
                             doc="The Pulsar namespace Kafka topics live in.")
    admin_port: int = setting(0, Range(-1, 65535), "webServicePort",
                              doc="Admin REST API port; 0: no admin API, -1: any free port. `kop standalone` "
                                  "uses 8080 when it is not set.")
    admin_host: str = setting("127.0.0.1", HostName(), doc="Interface the admin REST API listens on.")
    admin_authentication_enabled: bool = setting(
        False, None, doc="The admin API (all but /health, /ready, /metrics) asks for HTTP Basic credentials of a kop "
                         "user, or the admin token; reads need DESCRIBE on the cluster, changes ALTER (super users "
                         "without the authorizer).")
    admin_token: str = setting("", None, doc="A secret that authenticates admin API requests as "
                                             "`Authorization: Bearer <token>`, with every right; empty: none.")
    admin_failpoints_enabled: bool = setting(False, None, "adminFailpointsEnabled",
                                             doc="Serve the fault-injection routes of the admin API (tests only).")
    # topics
    auto_create_topics: bool = setting(True, None, "auto.create.topics.enable", update=CLUSTER_WIDE,
                                       doc="Create a topic when a client first asks for it.")
    num_partitions: int = setting(1, SIZE, update=CLUSTER_WIDE, doc="Partitions of an auto-created topic.")
    max_partitions_per_topic: int = setting(10000, SIZE, update=CLUSTER_WIDE,
                                            doc="The most partitions a topic may have.")
    # limits
    socket_request_max_bytes: int = setting(100 * 1024 * 1024, SIZE, doc="The largest request accepted.")
    message_max_bytes: int = setting(1048588, SIZE, update=CLUSTER_WIDE,
                                     doc="The largest record batch accepted (topic config `max.message.bytes` "
                                         "overrides it).")
    max_in_flight_requests_per_connection: int = setting(
        5, SIZE, doc="A connection is not read while this many of its requests are unanswered.")
    # One request may overshoot it, so any frame socket.request.max.bytes admits gets through.
    max_in_flight_bytes_per_connection: int = setting(
        10 * 1024 * 1024, Range(1, INT64_MAX),
        doc="A connection is not read while its unanswered requests hold this many bytes.")
    # Unbounded by default, as in Kafka: while it is reached no connection is read, so one client holding a half-sent
    # large frame would stall all others until the read timeout.
    queued_max_request_bytes: int = setting(-1, Range(1, INT64_MAX, unbounded=-1),
                                            doc="No connection is read while all unanswered requests together hold "
                                                "this many bytes.")
    connections_max_idle_ms: int = setting(600_000, MILLIS, doc="Close a connection idle this long between "
                                                                "requests.")
    # Kafka clients give up on a request after request.timeout.ms (30 s by default), so a body slower than that only
    # holds a buffer.
    socket_request_read_timeout_ms: int = setting(30_000, MILLIS,
                                                  doc="Close a connection whose request body, once its size is read, "
                                                      "does not arrive in this time.")
    max_connections: int = setting(10000, SIZE, update=CLUSTER_WIDE,
                                   doc="New connections beyond this many are closed at once. Count every "
                                       "client's connections, not clients: see [Sizing max.connections]"
                                       "(#sizing-maxconnections).")
    max_connections_per_ip: int = setting(INT32_MAX, SIZE, update=CLUSTER_WIDE,
                                          doc="New connections from one address beyond this many are closed at once "
                                              "(Kafka's key).")
    max_incremental_fetch_session_cache_slots: int = setting(
        1000, Range(0, INT32_MAX), doc="Fetch sessions (KIP-227) the broker keeps at most; past it a new one "
                                       "takes the place of one idle for two minutes, or of a smaller one older than "
                                       "that, else the consumer fetches without a session. 0: no sessions.")
    # storage
    storage: str = setting("file", Matches(r"file|postgres(ql)?://.+", "`file` or a postgresql:// URL"),
                           doc="Where topics and their partitions' managed ledgers are kept: `file` (the data "
                               "directory, one machine) or a PostgreSQL URL (`postgresql://user:password@host:port/"
                               "database`); kop creates and migrates its tables there. Every broker started on "
                               "the same database (each with its own node.id) joins one cluster.")
    broker_session_timeout_ms: int = setting(
        9000, Range(1000, INT32_MAX), "broker.session.timeout.ms",
        doc="PostgreSQL storage: a broker that has not renewed its lease for this long is dead, and its partitions "
            "move to the live brokers (Kafka's key).")
    broker_heartbeat_interval_ms: int = setting(
        2000, Range(100, INT32_MAX), "broker.heartbeat.interval.ms",
        doc="PostgreSQL storage: how often a broker renews its lease and follows the partitions' ownership.")
    managed_ledger_cache_bytes: int = setting(
        256 << 20, Range(1, INT64_MAX, unbounded=-1),
        doc="PostgreSQL storage: memory for the entries' bytes of every partition the broker owns, shared by all "
            "(Pulsar's managed-ledger entry cache; least recently used first out, new writes in). A takeover reads "
            "only each partition's index and its last MiB; a read it misses comes back short and the bytes are read "
            "back from PostgreSQL in the background. -1: hold every entry (memory grows with the data).")
    inter_broker_listener_name: str = setting(
        "", None, "inter.broker.listener.name",
        doc="PostgreSQL storage: the listener, by name, the brokers of a cluster send each other their requests on "
            "(transaction markers, offsets, verifications), with its security protocol (Kafka's key). Empty: the "
            "listener `security.inter.broker.protocol` names, else the first listener.")
    security_inter_broker_protocol: str = setting(
        "", Matches("|PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
        "security.inter.broker.protocol",
        doc="PostgreSQL storage: the brokers reach each other on the listener named like this security protocol "
            "(Kafka's key; set it or `inter.broker.listener.name`, not both).")
    sasl_mechanism_inter_broker_protocol: str = setting(
        "", Matches("|PLAIN|SCRAM-SHA-256|SCRAM-SHA-512", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
        "sasl.mechanism.inter.broker.protocol",
        doc="The SASL mechanism a broker authenticates with on a SASL inter-broker listener (Kafka's key). Empty: "
            "the first of `sasl.enabled.mechanisms` other than OAUTHBEARER.")
    inter_broker_sasl_username: str = setting(
        "", None, doc="The user a broker authenticates as on a SASL inter-broker listener (also the `username` of "
                      "Kafka's `sasl.jaas.config`); with an authorizer it needs CLUSTER_ACTION, e.g. as a super user.")
    inter_broker_sasl_password: str = setting(
        "", None, doc="Its password (also the `password` of Kafka's `sasl.jaas.config`).")
    ssl_endpoint_identification_algorithm: str = setting(
        "https", Matches("|https", "https or empty"),
        doc="On a TLS inter-broker listener, check that the other broker's certificate names the host it is reached "
            "at (https, Kafka's default); empty: do not. The certificate is checked against "
            "`ssl.truststore.location` (else the system's CAs), and the broker shows its own (its keystore's) when "
            "the other asks for one.")
    fsync: bool = setting(True, doc="Acknowledge a write only after an fsync covers it (group commit). Off: faster, "
                                    "and a machine crash can lose acknowledged records.")
    ledger_max_bytes: int = setting(256 * 1024 * 1024, Range(14), "log.segment.bytes",  # Kafka's lower bound
                                    update=CLUSTER_WIDE,
                                    doc="Start a new ledger once the current one is this large (topic config "
                                        "`segment.bytes`).")
    ledger_max_age_ms: int = setting(7 * 24 * 3600 * 1000, MILLIS, "log.roll.ms",
                                     update=CLUSTER_WIDE,
                                     doc="Start a new ledger once the current one's first entry is this old (also "
                                         "`log.roll.hours`; topic config `segment.ms`).")
    retention_ms: int = setting(7 * 24 * 3600 * 1000, Range(0, INT64_MAX, unbounded=-1), "log.retention.ms",
                                update=CLUSTER_WIDE,
                                doc="Delete a closed ledger once its newest record is this old (also "
                                    "`log.retention.minutes`, `log.retention.hours`; topic config `retention.ms`).")
    retention_bytes: int = setting(-1, Range(0, INT64_MAX, unbounded=-1), "log.retention.bytes",
                                   update=CLUSTER_WIDE,
                                   doc="Delete the oldest ledgers while a partition holds more than this (topic "
                                       "config `retention.bytes`).")
    retention_check_interval_ms: int = setting(5 * 60 * 1000, MILLIS, "log.retention.check.interval.ms",
                                               doc="How often retention runs.")
    log_cleaner_enable: bool = setting(True, None, "log.cleaner.enable",
                                       doc="Compact the topics whose `cleanup.policy` has `compact`, off the event "
                                           "loop (a process of its own on the file engine).")
    log_cleaner_backoff_ms: int = setting(15_000, MILLIS, "log.cleaner.backoff.ms",
                                          doc="How often the log cleaner looks for partitions to compact.")
    log_cleaner_io_max_bytes_per_second: int = setting(0, Range(0, INT64_MAX), "log.cleaner.io.max.bytes.per.second",
                                                       doc="The most bytes a second the log cleaner reads and writes "
                                                           "together; 0: no limit (Kafka's default).")
    # PIP-6 deduplication
    broker_deduplication_enabled: bool = setting(True, None, "brokerDeduplicationEnabled",
                                                 doc="Deduplicate idempotent producers and sequence-id records "
                                                     "(the broker level of the deduplication policy).")
    broker_deduplication_entries_interval: int = setting(
        1000, SIZE, "brokerDeduplicationEntriesInterval",
        doc="Snapshot a partition's dedup state after this many entries (or after as many entries as the snapshot "
            "holds names, if more).")
    broker_deduplication_snapshot_interval_seconds: int = setting(
        120, Range(0), "brokerDeduplicationSnapshotIntervalSeconds",
        doc="Snapshot a partition whose last snapshot is this old and has new entries (the broker level of the "
            "snapshot-interval policy); 0: no time-based snapshots.")
    broker_deduplication_snapshot_frequency_seconds: int = setting(
        120, Range(0), "brokerDeduplicationSnapshotFrequencyInSeconds",
        doc="How often the time-based snapshot check runs; 0: never.")
    # Pulsar's default is 10,000; Kafka gives every producer start a new id and application-chosen names are per
    # file or task, so a busy partition passes that within the inactivity timeout (BENCHMARKS.md: 100,000 names).
    broker_deduplication_max_number_of_producers: int = setting(
        100_000, SIZE, "brokerDeduplicationMaxNumberOfProducers",
        doc="The most producer names a snapshot keeps (the most recently written).")
    broker_deduplication_producer_inactivity_timeout_minutes: int = setting(
        360, SIZE, "brokerDeduplicationProducerInactivityTimeoutMinutes",
        doc="Forget a producer name not written for this long.")
    test_dedup_inactivity_timeout_seconds: int = setting(
        0, Range(0), "testDedupProducerInactivityTimeoutSeconds",
        doc="Tests only: when above 0, the inactivity timeout in seconds.")
    test_partition_load_delay_ms: int = setting(
        0, Range(0), "testPartitionLoadDelayMs",
        doc="Tests only: each partition's load at start-up waits this long first, as on a slow disk.")
    # geo-replication (PIP-33 replicated subscriptions for consumer groups)
    enable_replicated_subscriptions: bool = setting(True, None, "enableReplicatedSubscriptions",
                                                    doc="Replicate the positions of replicated consumer groups to the "
                                                        "other clusters (snapshot markers, PIP-33).")
    replicated_subscriptions_snapshot_frequency_millis: int = setting(
        1000, MILLIS, "replicatedSubscriptionsSnapshotFrequencyMillis",
        doc="How often a partition with a replicated group and new data takes a snapshot of the clusters' positions.")
    replicated_subscriptions_snapshot_timeout_seconds: int = setting(
        30, SIZE, "replicatedSubscriptionsSnapshotTimeoutSeconds",
        doc="A snapshot whose answers have not all come within this time is dropped.")
    replication_backlog_quota_limit_bytes: int = setting(
        -1, Range(0, INT64_MAX, unbounded=-1), "replicationBacklogQuotaLimitBytes",
        doc="Retention keeps the records a replicator has not sent yet, up to this many bytes per partition and "
            "remote cluster; past it, retention deletes them as if the replicator were not there and the remote "
            "misses them (Pulsar's backlog quota with its consumer_backlog_eviction policy). -1: no limit.")
    ttl_duration_default_in_seconds: int = setting(
        0, Range(0, 2**31 - 1), "ttlDurationDefaultInSeconds",
        doc="Message TTL where no namespace or topic policy sets one: a replicator does not send records stored "
            "longer ago than this (Pulsar's message TTL); they stay here for consumers and retention. 0: never.")
    replicated_subscriptions_snapshot_max_cached_per_subscription: int = setting(
        10, Range(3), "replicatedSubscriptionsSnapshotMaxCachedPerSubscription",
        doc="Completed snapshots kept per replicated group, spread between its position and the newest data.")
    # groups
    group_min_session_timeout_ms: int = setting(6000, SIZE, update=CLUSTER_WIDE,
                                                doc="The shortest session timeout a member may ask for.")
    group_max_session_timeout_ms: int = setting(1800000, SIZE, update=CLUSTER_WIDE,
                                                doc="The longest session timeout a member may ask for.")
    group_initial_rebalance_delay_ms: int = setting(0, Range(0), update=CLUSTER_WIDE,
                                                    doc="Wait this long for more members before the first rebalance "
                                                        "of an empty group (Kafka: 3000).")
    group_max_size: int = setting(INT32_MAX, SIZE, update=CLUSTER_WIDE, doc="The most members a group may have.")
    group_consumer_session_timeout_ms: int = setting(45000, SIZE, update=CLUSTER_WIDE,
                                                     doc="How long a member of a consumer-protocol group (KIP-848) "
                                                         "may go without a heartbeat before it is removed from the "
                                                         "group.")
    group_consumer_heartbeat_interval_ms: int = setting(5000, SIZE, update=CLUSTER_WIDE,
                                                        doc="How often members of consumer-protocol groups heartbeat "
                                                            "(the broker tells them).")
    group_consumer_assignors: str = setting(
        "uniform,range", CONSUMER_ASSIGNORS,
        doc="The server-side assignors members of consumer-protocol groups may ask for (`group.remote.assignor`); "
            "the first is used when none asks. Kafka's class names of the two are accepted too.")
    group_consumer_migration_policy: str = setting(
        "bidirectional", OneOf(("disabled", "upgrade", "downgrade", "bidirectional")),
        doc="Online migration of groups with members between the classic and the consumer protocol: `upgrade` lets "
            "a consumer-protocol member join a classic group (which becomes a consumer group), `downgrade` turns a "
            "consumer group whose last consumer-protocol member left back into a classic group, `bidirectional` "
            "both. Classic members may join a consumer group under every policy, and an empty group changes kind "
            "under every policy.")
    offset_metadata_max_bytes: int = setting(4096, Range(0), update=CLUSTER_WIDE,
                                             doc="The longest metadata string an offset commit may carry.")
    offsets_retention_check_interval_ms: int = setting(600_000, MILLIS,
                                                       doc="How often empty groups without offsets are forgotten.")
    # transactions (Kafka's keys and defaults)
    transaction_max_timeout_ms: int = setting(900_000, Range(1, INT32_MAX),
                                              update=CLUSTER_WIDE,
                                              doc="The longest transaction timeout a producer may ask for.")
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = setting(
        10_000, Range(1, INT32_MAX), doc="How often transactions open past their timeout are aborted.")
    transactional_id_expiration_ms: int = setting(7 * 24 * 3600 * 1000, Range(1, INT32_MAX),
                                                  doc="Forget a transactional id not used for this long.")
    # the aborted-transaction index kept with each ledger (kop's own)
    transaction_index_max_aborted_per_ledger: int = setting(
        10_000, SIZE, doc="A ledger rolls once it holds this many transactions' ABORT markers: a ledger's "
                          "aborted-transaction index stays in memory, and in each transaction snapshot, until it "
                          "closes.")
    transaction_index_cache_bytes: int = setting(
        16 << 20, Range(0), doc="Memory for the aborted-transaction indexes of closed ledgers read back for "
                                "read_committed fetches, shared by all partitions (least recently used first out; 32 "
                                "bytes a transaction).")

    def __post_init__(self) -> None:
        for f in fields(self):
            try:
                check_setting(f.name, getattr(self, f.name))
            except ValueError as exc:
                raise ValueError(f"{setting_key(f.name)}: {exc}") from None
        for holds, message in RULES:
            if not holds(self):
                raise ValueError(message(self))

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host

    @property
    def consumer_assignors(self) -> tuple[str, ...]:
        return CONSUMER_ASSIGNORS.parse(self.group_consumer_assignors)


# Rules between settings: (holds, what to say when it does not).
RULES: tuple[tuple[Callable[[BrokerConfig], bool], Callable[[BrokerConfig], str]], ...] = (
    (lambda c: c.num_partitions <= c.max_partitions_per_topic,
     lambda c: f"num.partitions ({c.num_partitions}) exceeds max.partitions.per.topic ({c.max_partitions_per_topic})"),
    (lambda c: c.group_consumer_heartbeat_interval_ms < c.group_consumer_session_timeout_ms,
     lambda c: f"group.consumer.heartbeat.interval.ms ({c.group_consumer_heartbeat_interval_ms}) must be less than "
               f"group.consumer.session.timeout.ms ({c.group_consumer_session_timeout_ms})"),
    (lambda c: c.group_min_session_timeout_ms <= c.group_max_session_timeout_ms,
     lambda c: f"group.min.session.timeout.ms ({c.group_min_session_timeout_ms}) exceeds "
               f"group.max.session.timeout.ms ({c.group_max_session_timeout_ms})"),
    (lambda c: listener_problem(c) is None, lambda c: str(listener_problem(c))),
    (lambda c: "OAUTHBEARER" not in c.sasl_enabled_mechanisms.split(",")
     or c.sasl_oauthbearer_unsecured_validator_enabled,
     lambda c: "sasl.enabled.mechanisms includes OAUTHBEARER but no token validator is configured: set "
               "sasl.oauthbearer.unsecured.validator.enabled=true (development only: it trusts unsigned tokens)"),
    (lambda c: c.host not in WILDCARD_HOSTS or c.advertised_host != "",
     lambda c: f"listening on every interface ({c.host}) needs an advertised host clients can connect to: set "
               f"--advertised-host or advertised.listeners"),
    (lambda c: c.broker_heartbeat_interval_ms * 2 <= c.broker_session_timeout_ms,
     lambda c: f"broker.heartbeat.interval.ms ({c.broker_heartbeat_interval_ms}) must be at most half of "
               f"broker.session.timeout.ms ({c.broker_session_timeout_ms}): a lease must survive a late renewal"),
)

def listener_specs(config: BrokerConfig) -> list[ListenerSpec]:
    return resolve_listeners(config.listeners, config.advertised_listeners, config.listener_security_protocol_map,
                             config.host, config.port, config.advertised_host, config.advertised_port)


def listener_problem(config: BrokerConfig) -> str | None:
    try:
        specs = listener_specs(config)
    except ValueError as exc:
        return f"listeners: {exc}"
    if any(spec.tls for spec in specs) and not config.ssl_keystore_location:
        return "an SSL or SASL_SSL listener needs ssl.keystore.location (a PEM certificate chain and key)"
    names = [spec.name for spec in specs]
    if config.inter_broker_listener_name and config.security_inter_broker_protocol:
        return "set inter.broker.listener.name or security.inter.broker.protocol, not both"
    wanted = config.inter_broker_listener_name or config.security_inter_broker_protocol
    key = "inter.broker.listener.name" if config.inter_broker_listener_name else "security.inter.broker.protocol"
    if wanted and wanted not in names:
        return f"{key} {wanted} names no listener (listeners: {', '.join(names)})"
    mechanism = config.sasl_mechanism_inter_broker_protocol
    if mechanism and mechanism not in config.sasl_enabled_mechanisms.split(","):
        return f"sasl.mechanism.inter.broker.protocol {mechanism} is not in sasl.enabled.mechanisms: the other " \
               f"brokers would refuse it"
    return None


def inter_broker_problem(config: BrokerConfig) -> str | None:
    """Why this broker cannot send the others requests on its inter-broker listener (None: it can). A lone broker
    sends none, so this is said when they are sent, not at start-up."""
    between = inter_broker_listener(config, listener_specs(config))
    if not between.sasl:
        return None
    if inter_broker_mechanism(config) is None:
        return f"the inter-broker listener {between.name} is {between.protocol} and no SASL mechanism a broker can " \
               f"sign in with is enabled (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
    if not config.inter_broker_sasl_username or not config.inter_broker_sasl_password:
        return f"the inter-broker listener {between.name} is {between.protocol}: give the brokers' own credentials " \
               f"(inter.broker.sasl.username and inter.broker.sasl.password, or Kafka's sasl.jaas.config with " \
               f"username and password)"
    return None


def inter_broker_listener(config: BrokerConfig, specs: list[ListenerSpec]) -> ListenerSpec:
    """The listener the brokers of a cluster reach each other on: inter.broker.listener.name, else the one named
    like security.inter.broker.protocol, else the first."""
    wanted = config.inter_broker_listener_name or config.security_inter_broker_protocol
    return next((spec for spec in specs if spec.name == wanted), specs[0])


def inter_broker_mechanism(config: BrokerConfig) -> str | None:
    """The SASL mechanism of the brokers' requests to each other: as set, else the first enabled one they can use."""
    enabled = config.sasl_enabled_mechanisms.split(",")
    return config.sasl_mechanism_inter_broker_protocol or next((m for m in enabled if m != "OAUTHBEARER"), None)


FIELDS = {f.name: f for f in fields(BrokerConfig)}


def settings_not_default(config: BrokerConfig) -> frozenset[str]:
    """The fields holding other than their default: what was set, when nobody recorded what was (a broker made in
    code rather than from a properties file and command line)."""
    defaults = BrokerConfig()
    return frozenset(name for name in FIELDS if getattr(config, name) != getattr(defaults, name))


def setting_key(name: str) -> str:
    """The key users know the field by: its first file key (Kafka's or Pulsar's name), else its name with dots."""
    keys = FIELDS[name].metadata["keys"]
    return keys[0] if keys else name.replace("_", ".")


def check_setting(name: str, value: Any) -> None:
    """Raise ValueError saying what field `name` accepts when `value` is not one of those values."""
    f = FIELDS[name]
    if not isinstance(value, f.type) or (f.type is int and isinstance(value, bool)):
        raise ValueError(f"expected {f.type.__name__}, got {value!r}")
    if f.metadata["check"] is not None:
        f.metadata["check"](value)


# Kafka accepts true and false in any case; yes/no/on/off/1/0 are kept from kop's first parser.
BOOLEANS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _boolean(raw: str) -> bool:
    value = BOOLEANS.get(raw.lower())
    if value is None:
        raise ValueError(f"not a boolean (true or false): {raw!r}")
    return value


def parse_integer(raw: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", raw):
        raise ValueError(f"not an integer: {raw!r}")
    return int(raw)


CONVERTERS: dict[type, Callable[[str], Any]] = {bool: _boolean, int: parse_integer, str: str}


def parse_setting(name: str, raw: str) -> Any:
    """The value of field `name` written as `raw` (a file value or a command-line argument), checked."""
    value = CONVERTERS[FIELDS[name].type](raw.strip())
    check_setting(name, value)
    return value
