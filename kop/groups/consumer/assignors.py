"""Server-side assignors of the consumer group protocol (KIP-848): pure functions from the members' subscriptions and
the subscribed topics' partition counts to each member's target partitions. Names are what clients ask for with
`group.remote.assignor`.

- uniform (the default): every partition goes to one of the members subscribed to its topic, as evenly as the
  subscriptions allow; a partition stays with its current owner while that keeps the balance, so a member joining or
  leaving moves only the partitions it must.
- range: per topic, the subscribed members in member id order take contiguous ranges of partitions, the first
  `partitions % members` one more: members subscribed to co-partitioned topics get the same partition numbers.
"""
from collections.abc import Callable, Mapping

# member id -> topic -> partitions
Assignment = dict[str, dict[str, set[int]]]
Assignor = Callable[[Mapping[str, frozenset[str]], Mapping[str, int], Assignment], Assignment]


def _empty(subscriptions: Mapping[str, frozenset[str]]) -> Assignment:
    return {member: {} for member in subscriptions}


def _subscribers(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int]) -> dict[str, list[str]]:
    """topic -> the members subscribed to it, in member id order (topics that do not exist are left out)."""
    out: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in subscriptions[member]:
            if topic in partitions:
                out.setdefault(topic, []).append(member)
    return out


def range_assignor(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int],
                   current: Assignment) -> Assignment:
    target = _empty(subscriptions)
    for topic, members in _subscribers(subscriptions, partitions).items():
        count = partitions[topic]
        share, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            size = share + (1 if i < extra else 0)
            if size:
                target[member][topic] = set(range(start, start + size))
            start += size
    return target


def uniform_assignor(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int],
                     current: Assignment) -> Assignment:
    subscribers = _subscribers(subscriptions, partitions)
    target = _empty(subscriptions)
    load = {member: 0 for member in subscriptions}
    # A member's fair share: the most it may keep of what it owns (the partitions of its topics over the members
    # that share them, rounded up).
    quota = {member: 0.0 for member in subscriptions}
    for topic, members in subscribers.items():
        for member in members:
            quota[member] += partitions[topic] / len(members)
    free: list[tuple[str, int]] = []
    # who holds each partition in the current target (a target gives a partition to one member at most)
    owners = {(topic, index): member for member, per_topic in current.items() if member in load
              for topic, indexes in per_topic.items() for index in indexes}
    for topic in sorted(subscribers):
        subscribed = set(subscribers[topic])
        for index in range(partitions[topic]):
            owner = owners.get((topic, index))
            if owner not in subscribed or load[owner] >= -(-quota[owner] // 1):
                owner = None
            if owner is None:
                free.append((topic, index))
            else:
                target[owner].setdefault(topic, set()).add(index)
                load[owner] += 1
    for topic, index in free:
        member = min(subscribers[topic], key=lambda m: (load[m], m))
        target[member].setdefault(topic, set()).add(index)
        load[member] += 1
    _rebalance(subscribers, target, load)
    return target


def _rebalance(subscribers: dict[str, list[str]], target: Assignment, load: dict[str, int]) -> None:
    """Move partitions from the most to the least loaded member that may take them until no move narrows the gap
    (stickiness may have left a member above its share while another, subscribed to the same topic, has less)."""
    moved = True
    while moved:
        moved = False
        for topic, members in subscribers.items():
            heavy = max(members, key=lambda m: (load[m], m))
            light = min(members, key=lambda m: (load[m], m))
            owned = target[heavy].get(topic)
            if load[heavy] - load[light] > 1 and owned:
                index = max(owned)
                owned.discard(index)
                if not owned:
                    del target[heavy][topic]
                target[light].setdefault(topic, set()).add(index)
                load[heavy] -= 1
                load[light] += 1
                moved = True


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform_assignor, "range": range_assignor}
DEFAULT_ASSIGNOR = "uniform"
