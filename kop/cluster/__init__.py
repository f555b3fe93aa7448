"""Several brokers on one PostgreSQL database: membership leases, partition ownership, who leads what.

kop/cluster/membership.py keeps this broker's lease in the database; kop/cluster/ownership.py decides, from the live
brokers alone, which one owns each partition; kop/cluster/service.py runs the loops that renew the lease and open and
close partitions as ownership moves; kop/cluster/groups.py and kop/cluster/offsets.py make each group's coordinator
the owner of its `__consumer_offsets` shard, and kop/cluster/transactions.py each transactional id's coordinator the
owner of its `__transaction_state` shard; kop/cluster/peers.py carries the requests brokers send each other. The file
engine is one broker owning everything (SingleBroker).
"""
from kop.cluster.membership import Member
from kop.cluster.service import Cluster, ClusterService, SingleBroker

__all__ = ["Cluster", "ClusterService", "Member", "SingleBroker"]
