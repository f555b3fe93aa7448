#!/bin/sh
# Stand-in for Kafka's bin/kafka-acls.sh: librdkafka's tests 0109, 0115 and 0119 run "$KAFKA_PATH/bin/kafka-acls.sh
# --bootstrap-server ... --add --deny-principal ..." to deny or grant a topic. This one sends the same CreateAcls
# requests through the Admin API (kafka-python), which is all the real script does against a Kafka 3.x broker.
repo="$(cd "$(dirname "$0")/../../../.." && pwd)"
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "${KOP_COMPAT_PYTHON:-python3}" -m compat.librdkafka.kafka_acls "$@"
