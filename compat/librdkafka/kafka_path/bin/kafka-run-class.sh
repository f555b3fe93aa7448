#!/bin/sh
# Stand-in for Kafka's bin/kafka-run-class.sh: runs a Java class with $CLASSPATH and the jars in ../libs, all the
# suite asks of it (0098_consumer_txn runs librdkafka's tests/java/TransactionProducerCli through it).
libs="$(cd "$(dirname "$0")/../libs" && pwd)"
exec java -cp "${CLASSPATH:+$CLASSPATH:}$libs/*" "$@"
