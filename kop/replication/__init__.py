"""Geo-replication: the clusters this broker knows, a replicator per partition and remote cluster, and the handling
of what replicators send (see docs/geo-replication.md)."""
