"""librdkafka's regression suite (tests/ of the librdkafka bundled in node-rdkafka) against kop."""
