"""The PySpark pipeline (ingest files -> kop, transform kop -> kop, audit) and kop's Spark Python Data Source
(`format("kop")`). A client of kop like any other: it talks to brokers over Kafka and the admin REST API only."""
