#!/bin/sh
# Stand-in for Kafka's bin/kafka-topics.sh: librdkafka's tests run "$KAFKA_PATH/bin/kafka-topics.sh
# --bootstrap-server ... --create/--alter/--delete ..." to set up topics. This one does the same through the
# Admin API (kafka-python), which is also all the real script does against a Kafka 3.x broker.
repo="$(cd "$(dirname "$0")/../../../.." && pwd)"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "${KOP_COMPAT_PYTHON:-python3}" -m compat.librdkafka.kafka_topics "$@"
