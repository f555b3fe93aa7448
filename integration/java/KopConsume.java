import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Reads a whole topic without a consumer group: assigns every partition, seeks to the beginning, and polls until
 * each partition's position reaches the end offset taken at the start (or --deadline-ms passes).
 * Prints one JSON line per record, then a summary line with "complete", the end offsets and the positions.
 */
public final class KopConsume {
    private static final Duration METADATA_RETRY = Duration.ofMillis(200);
    // Positions are asked for after the deadline too (for the summary), so they get their own small bound.
    private static final Duration POSITION_TIMEOUT = Duration.ofSeconds(5);

    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String topic = args.required("topic");
        long deadline = System.nanoTime() + Duration.ofMillis(args.longValue("deadline-ms", 60_000)).toNanos();

        Properties props = args.clientProperties();
        props.putIfAbsent(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putIfAbsent(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putIfAbsent(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");

        long records = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = partitionsOf(consumer, topic, deadline);
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, remaining(deadline));
            while (!reachedEnds(consumer, ends) && remaining(deadline).toMillis() > 0) {
                Duration wait = min(remaining(deadline), Duration.ofMillis(500));
                for (ConsumerRecord<String, String> record : consumer.poll(wait)) {
                    RecordLines.emit(record);
                    records++;
                }
            }
            Json.object()
                .put("type", "summary")
                .put("records", records)
                .put("complete", reachedEnds(consumer, ends))
                .put("end_offsets", byPartition(ends))
                .put("positions", positions(consumer, partitions))
                .emit();
        }
    }

    /** Waits (bounded by the deadline) for the topic to appear in metadata: it may have just been created. */
    private static List<TopicPartition> partitionsOf(KafkaConsumer<?, ?> consumer, String topic, long deadline)
            throws InterruptedException {
        while (true) {
            List<PartitionInfo> infos;
            try {
                infos = consumer.partitionsFor(topic, remaining(deadline));
            } catch (TimeoutException noMetadataYet) {
                infos = List.of();
            }
            if (infos != null && !infos.isEmpty()) {
                List<TopicPartition> partitions = new ArrayList<>();
                for (PartitionInfo info : infos) {
                    partitions.add(new TopicPartition(topic, info.partition()));
                }
                return partitions;
            }
            if (remaining(deadline).compareTo(METADATA_RETRY) <= 0) {
                throw new IllegalStateException("topic " + topic + " has no partitions in metadata");
            }
            Thread.sleep(METADATA_RETRY.toMillis());
        }
    }

    private static boolean reachedEnds(KafkaConsumer<?, ?> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> end : ends.entrySet()) {
            Long position = position(consumer, end.getKey());
            if (position == null || position < end.getValue()) {
                return false;
            }
        }
        return true;
    }

    private static Map<Integer, Long> positions(KafkaConsumer<?, ?> consumer, List<TopicPartition> partitions) {
        Map<Integer, Long> positions = new TreeMap<>();
        for (TopicPartition partition : partitions) {
            positions.put(partition.partition(), position(consumer, partition));
        }
        return positions;
    }

    /** The next offset to read, or null while the consumer cannot tell (no answer from the broker yet). */
    private static Long position(KafkaConsumer<?, ?> consumer, TopicPartition partition) {
        try {
            return consumer.position(partition, POSITION_TIMEOUT);
        } catch (TimeoutException unknownYet) {
            return null;
        }
    }

    private static Map<Integer, Long> byPartition(Map<TopicPartition, Long> offsets) {
        Map<Integer, Long> result = new TreeMap<>();
        offsets.forEach((partition, offset) -> result.put(partition.partition(), offset));
        return result;
    }

    private static Duration remaining(long deadline) {
        return Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
    }

    private static Duration min(Duration a, Duration b) {
        return a.compareTo(b) <= 0 ? a : b;
    }
}
