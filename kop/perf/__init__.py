"""`kop perf produce|consume`: throughput and latency of any Kafka-compatible broker, measured with librdkafka."""
