"""Kafka transactions: the coordinator (`coordinator`) and its state log (`state_log`, `state`), and what each
partition keeps of transactions (`partition_index`: open ones, the last stable offset, the aborted index). Import
from the modules: the partition imports `partition_index` while the coordinator needs the partitions."""
