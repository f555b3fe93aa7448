"""Small helpers for applications of kop: Kafka and admin REST clients only, never the broker's internals."""
