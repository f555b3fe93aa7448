"""The admin REST API (Pulsar's paths for deduplication policies, topic stats and internal stats) and the
`kop admin` command-line client over it."""
