"""kop's own request schemas, in Kafka's JSON message format, read by kafka-python's schema machinery."""
