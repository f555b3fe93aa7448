"""Who owns what in a cluster: rendezvous hashing of partitions over live node ids, and Kafka's group-to-shard rule."""
from kop.cluster.groups import shard_of
from kop.cluster.ownership import owner_of

KEYS = [f"t{t}-partition-{p}" for t in range(20) for p in range(10)]


def test_every_broker_computes_the_same_owner_whatever_order_it_lists_the_members_in():
    assert all(owner_of(key, [1, 2, 3]) == owner_of(key, [3, 1, 2]) for key in KEYS)
    assert owner_of("t-partition-0", []) is None


def test_a_broker_leaving_moves_only_its_own_partitions_and_they_spread_over_the_others():
    before = {key: owner_of(key, [1, 2, 3]) for key in KEYS}
    after = {key: owner_of(key, [1, 3]) for key in KEYS}
    assert {key for key in KEYS if before[key] != after[key]} == {key for key in KEYS if before[key] == 2}
    assert {after[key] for key in KEYS if before[key] == 2} == {1, 3}
    shares = [sum(1 for owner in before.values() if owner == node) for node in (1, 2, 3)]
    assert min(shares) > len(KEYS) // 5, shares  # about a third each


def test_group_ids_map_to_shards_as_kafka_maps_them_to_consumer_offsets_partitions():
    # abs(String.hashCode()) % 50: "test".hashCode() = 3556498; "polygenelubricants".hashCode() = Integer.MIN_VALUE,
    # which Kafka's Utils.abs turns into 0; UTF-16 code units, surrogate pairs included.
    assert shard_of("test") == 3556498 % 50
    assert shard_of("polygenelubricants") == 0
    assert shard_of("\u00e9") == 233 % 50
    assert shard_of("\U0001F600") == (31 * 0xD83D + 0xDE00) % 50
