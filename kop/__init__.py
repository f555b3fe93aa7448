"""kop: a Kafka wire-protocol broker on a Pulsar-style managed ledger with PIP-6 deduplication."""
