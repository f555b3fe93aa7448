"""External compatibility gate: third-party client test suites run against a live `kop standalone`.

`python -m compat.run` runs librdkafka's own regression suite (built from the sources bundled in the
node-rdkafka npm package) and kafka-python's integration tests, each limited to an allowlist; every test
left out is explained in that suite's FINDINGS.md.
"""
