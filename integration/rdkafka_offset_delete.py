"""OffsetDelete through librdkafka's admin API (rd_kafka_DeleteConsumerGroupOffsets), called with ctypes.

confluent-kafka's Python AdminClient (2.16) does not wrap this call, although the librdkafka it ships implements it
(it is what librdkafka-based tools use to delete a group's offsets). Calling the bundled library directly keeps the
test on the real client code that builds the request and reads the answer.
"""
import ctypes
import glob
import os
from dataclasses import dataclass

EVENT_DELETE_GROUP_OFFSETS_RESULT = 107  # RD_KAFKA_EVENT_DELETECONSUMERGROUPOFFSETS_RESULT
RD_KAFKA_PRODUCER = 0  # the client type is irrelevant to the admin API


class _TopicPartition(ctypes.Structure):  # rd_kafka_topic_partition_t, public and stable in rdkafka.h
    _fields_ = [("topic", ctypes.c_char_p), ("partition", ctypes.c_int32), ("offset", ctypes.c_int64),
                ("metadata", ctypes.c_void_p), ("metadata_size", ctypes.c_size_t), ("opaque", ctypes.c_void_p),
                ("err", ctypes.c_int), ("_private", ctypes.c_void_p)]


class _PartitionList(ctypes.Structure):  # rd_kafka_topic_partition_list_t
    _fields_ = [("cnt", ctypes.c_int), ("size", ctypes.c_int), ("elems", ctypes.POINTER(_TopicPartition))]


@dataclass(frozen=True)
class OffsetDeleteResult:
    error: str | None  # the group-level error, librdkafka's name for it (e.g. "GROUP_ID_NOT_FOUND")
    partitions: dict[tuple[str, int], str | None]  # per-partition error names, None for success


def _library() -> ctypes.CDLL:
    import confluent_kafka
    libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    found = glob.glob(os.path.join(libs, "librdkafka*.so*"))
    if not found:
        raise RuntimeError(f"no librdkafka shared library in {libs}")
    lib = ctypes.CDLL(found[0])
    p, s = ctypes.c_void_p, ctypes.c_char_p
    for name, restype, argtypes in [
        ("rd_kafka_conf_new", p, []),
        ("rd_kafka_conf_set", ctypes.c_int, [p, s, s, s, ctypes.c_size_t]),
        ("rd_kafka_new", p, [ctypes.c_int, p, s, ctypes.c_size_t]),
        ("rd_kafka_destroy", None, [p]),
        ("rd_kafka_queue_new", p, [p]),
        ("rd_kafka_queue_destroy", None, [p]),
        ("rd_kafka_queue_poll", p, [p, ctypes.c_int]),
        ("rd_kafka_event_type", ctypes.c_int, [p]),
        ("rd_kafka_event_error", ctypes.c_int, [p]),
        ("rd_kafka_event_destroy", None, [p]),
        ("rd_kafka_err2name", s, [ctypes.c_int]),
        ("rd_kafka_topic_partition_list_new", ctypes.POINTER(_PartitionList), [ctypes.c_int]),
        ("rd_kafka_topic_partition_list_add", p, [ctypes.POINTER(_PartitionList), s, ctypes.c_int32]),
        ("rd_kafka_topic_partition_list_destroy", None, [ctypes.POINTER(_PartitionList)]),
        ("rd_kafka_DeleteConsumerGroupOffsets_new", p, [s, ctypes.POINTER(_PartitionList)]),
        ("rd_kafka_DeleteConsumerGroupOffsets_destroy", None, [p]),
        ("rd_kafka_DeleteConsumerGroupOffsets", None, [p, ctypes.POINTER(p), ctypes.c_size_t, p, p]),
        ("rd_kafka_event_DeleteConsumerGroupOffsets_result", p, [p]),
        ("rd_kafka_DeleteConsumerGroupOffsets_result_groups", ctypes.POINTER(p), [p, ctypes.POINTER(ctypes.c_size_t)]),
        ("rd_kafka_group_result_error", p, [p]),
        ("rd_kafka_group_result_partitions", ctypes.POINTER(_PartitionList), [p]),
        ("rd_kafka_error_code", ctypes.c_int, [p]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def delete_group_offsets(bootstrap: str, group: str, partitions: list[tuple[str, int]],
                         timeout_s: float = 20.0) -> OffsetDeleteResult:
    lib = _library()
    err = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    if lib.rd_kafka_conf_set(conf, b"bootstrap.servers", bootstrap.encode(), err, len(err)) != 0:
        raise RuntimeError(err.value.decode())
    rk = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, len(err))  # takes over conf
    if not rk:
        raise RuntimeError(err.value.decode())
    queue = request = wanted = event = None
    try:
        queue = lib.rd_kafka_queue_new(rk)
        wanted = lib.rd_kafka_topic_partition_list_new(len(partitions))
        for topic, partition in partitions:
            lib.rd_kafka_topic_partition_list_add(wanted, topic.encode(), partition)
        request = lib.rd_kafka_DeleteConsumerGroupOffsets_new(group.encode(), wanted)
        lib.rd_kafka_DeleteConsumerGroupOffsets(rk, ctypes.byref(ctypes.c_void_p(request)), 1, None, queue)
        event = lib.rd_kafka_queue_poll(queue, int(timeout_s * 1000))
        if not event:
            raise TimeoutError(f"no DeleteConsumerGroupOffsets result in {timeout_s}s")
        if lib.rd_kafka_event_type(event) != EVENT_DELETE_GROUP_OFFSETS_RESULT:
            raise RuntimeError(f"unexpected event type {lib.rd_kafka_event_type(event)}")
        name = lambda code: lib.rd_kafka_err2name(code).decode() if code else None  # noqa: E731
        top = lib.rd_kafka_event_error(event)
        if top:
            return OffsetDeleteResult(name(top), {})
        count = ctypes.c_size_t()
        groups = lib.rd_kafka_DeleteConsumerGroupOffsets_result_groups(
            lib.rd_kafka_event_DeleteConsumerGroupOffsets_result(event), ctypes.byref(count))
        assert count.value == 1, f"{count.value} group results for one group"
        group_error = lib.rd_kafka_group_result_error(groups[0])
        group_code = lib.rd_kafka_error_code(group_error) if group_error else 0
        listed = lib.rd_kafka_group_result_partitions(groups[0])
        per_partition = {}
        if listed:
            for i in range(listed.contents.cnt):
                tp = listed.contents.elems[i]
                per_partition[(tp.topic.decode(), tp.partition)] = name(tp.err)
        return OffsetDeleteResult(name(group_code), per_partition)
    finally:
        if event:
            lib.rd_kafka_event_destroy(event)
        if request:
            lib.rd_kafka_DeleteConsumerGroupOffsets_destroy(request)
        if wanted:
            lib.rd_kafka_topic_partition_list_destroy(wanted)
        if queue:
            lib.rd_kafka_queue_destroy(queue)
        lib.rd_kafka_destroy(rk)
