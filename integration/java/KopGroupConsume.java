import java.time.Duration;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.HashSet;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.TreeMap;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Consumes --topic (several topics: comma-separated) as a member of --group until --max-records records were
 * read, nothing new arrived for --idle-ms since the last record or assignment, --deadline-ms passed, or the file
 * --stop-file names exists (how a long-lived member is told to leave). Prints a JSON line per record, per
 * assignment change (assigned, revoked, lost), per commit, and a summary line with the reason it stopped.
 *
 * --commit sync|async|none: after each poll, and synchronously for partitions being revoked, commit the offsets
 * of the records printed so far (never past --max-records); "async" commits asynchronously and then once
 * synchronously before closing.
 * --commit-metadata TEXT attaches TEXT to every commit, with the leader epoch of the record committed past, or
 * --commit-leader-epoch N. --print-committed 1 prints, on each assignment, what consumer.committed() reads for the
 * assigned partitions (offset, leader epoch, metadata).
 * Assignment and commit lines name each partition's topic too ("topic_partitions", "topic_offsets"), and a commit
 * line carries the generation it was made in and the wall clock, so commits of several members can be compared.
 * Assignor, group.instance.id and auto-commit come in as --prop client settings.
 */
public final class KopGroupConsume {
    private static final Duration POLL = Duration.ofMillis(200);
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(10);

    private final long startedAt = System.nanoTime();
    private final Map<TopicPartition, OffsetAndMetadata> consumed = new HashMap<>();
    private KafkaConsumer<String, String> consumer;
    private long lastProgressAt = -1;
    private String commitMode = "sync";
    private String commitMetadata;
    private Optional<Integer> commitLeaderEpoch = Optional.empty();
    private boolean printCommitted;
    private List<Integer> finalAssignment = List.of();
    private List<List<Object>> finalTopicAssignment = List.of();

    public static void main(String[] argv) {
        new KopGroupConsume().run(new HarnessArgs(argv));
    }

    private void run(HarnessArgs args) {
        List<String> topics = List.of(args.required("topic").split(","));
        Path stopFile = args.has("stop-file") ? Path.of(args.required("stop-file")) : null;
        long maxRecords = args.longValue("max-records", Long.MAX_VALUE);
        long idleNanos = Duration.ofMillis(args.longValue("idle-ms", 5_000)).toNanos();
        long deadline = startedAt + Duration.ofMillis(args.longValue("deadline-ms", 60_000)).toNanos();
        commitMode = args.optional("commit", "sync");
        if (!List.of("sync", "async", "none").contains(commitMode)) {
            throw new IllegalArgumentException("--commit wants sync, async or none, got: " + commitMode);
        }

        commitMetadata = args.optional("commit-metadata", null);
        if (args.has("commit-leader-epoch")) {
            commitLeaderEpoch = Optional.of(args.intValue("commit-leader-epoch", -1));
        }
        printCommitted = args.has("print-committed");

        Properties props = args.clientProperties();
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args.required("group"));
        props.putIfAbsent(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putIfAbsent(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putIfAbsent(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.putIfAbsent(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");

        long records = 0;
        String reason = "deadline";
        consumer = new KafkaConsumer<>(props);
        try {
            consumer.subscribe(topics, new AssignmentPrinter());
            while (System.nanoTime() < deadline) {
                if (stopFile != null && Files.exists(stopFile)) {
                    reason = "stopped";
                    break;
                }
                if (records >= maxRecords) {
                    reason = "max_records";
                    break;
                }
                // The idle clock starts at the first assignment: joining a group may take a while.
                if (lastProgressAt >= 0 && System.nanoTime() - lastProgressAt >= idleNanos) {
                    reason = "idle";
                    break;
                }
                ConsumerRecords<String, String> batch = consumer.poll(POLL);
                for (ConsumerRecord<String, String> record : batch) {
                    if (records >= maxRecords) {
                        break;
                    }
                    RecordLines.emit(record);
                    consumed.put(new TopicPartition(record.topic(), record.partition()), offsetAfter(record));
                    records++;
                }
                if (!batch.isEmpty()) {
                    lastProgressAt = System.nanoTime();
                    commit(commitMode, false);
                }
            }
            commit(commitMode, true);
        } finally {
            finalAssignment = partitionNumbers(consumer.assignment());
            finalTopicAssignment = topicPartitions(consumer.assignment());
            consumer.close(CLOSE_TIMEOUT);  // may print a last "revoked" line
        }
        // The summary is the last line, after anything close() printed.
        Json.object()
            .put("type", "summary")
            .put("records", records)
            .put("reason", reason)
            .put("assignment", finalAssignment)
            .put("topic_assignment", finalTopicAssignment)
            .emit();
    }

    private OffsetAndMetadata offsetAfter(ConsumerRecord<String, String> record) {
        if (commitMetadata == null && commitLeaderEpoch.isEmpty()) {
            return new OffsetAndMetadata(record.offset() + 1);
        }
        Optional<Integer> epoch = commitLeaderEpoch.isPresent() ? commitLeaderEpoch : record.leaderEpoch();
        return new OffsetAndMetadata(record.offset() + 1, epoch, commitMetadata == null ? "" : commitMetadata);
    }

    private void printCommittedOffsets(Collection<TopicPartition> partitions) {
        Map<Integer, Object> byPartition = new TreeMap<>();
        consumer.committed(new HashSet<>(partitions)).forEach((partition, offset) -> byPartition.put(
            partition.partition(), offset == null ? null : Json.object()
                .put("offset", offset.offset())
                .put("leader_epoch", offset.leaderEpoch().orElse(-1))
                .put("metadata", offset.metadata())));
        Json.object().put("type", "committed_read").put("offsets", byPartition).emit();
    }

    private void commit(String mode, boolean closing) {
        if (consumed.isEmpty() || mode.equals("none")) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>(consumed);
        if (mode.equals("async") && !closing) {
            consumer.commitAsync(offsets, (committed, error) -> printCommit(offsets, error));
            return;
        }
        commitSync(offsets);
    }

    private void commitRevoked(Collection<TopicPartition> partitions) {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        partitions.forEach(partition -> {
            OffsetAndMetadata offset = consumed.get(partition);
            if (offset != null) {
                offsets.put(partition, offset);
            }
        });
        if (!offsets.isEmpty() && !commitMode.equals("none")) {
            commitSync(offsets);
        }
    }

    private void commitSync(Map<TopicPartition, OffsetAndMetadata> offsets) {
        try {
            consumer.commitSync(offsets);
            printCommit(offsets, null);
        } catch (KafkaException error) {
            // A rebalance can reject a commit; report it and keep consuming, as an application would.
            printCommit(offsets, error);
        }
    }

    private void printCommit(Map<TopicPartition, OffsetAndMetadata> offsets, Exception error) {
        Map<Integer, Long> byPartition = new TreeMap<>();
        Map<String, Map<Integer, Long>> byTopic = new TreeMap<>();
        offsets.forEach((partition, offset) -> {
            byPartition.put(partition.partition(), offset.offset());
            byTopic.computeIfAbsent(partition.topic(), topic -> new TreeMap<>()).put(partition.partition(),
                                                                                   offset.offset());
        });
        Json.object()
            .put("type", error == null ? "committed" : "commit_failed")
            .put("offsets", byPartition)
            .put("topic_offsets", byTopic)
            .put("generation", consumer.groupMetadata().generationId())
            .put("wall_ms", System.currentTimeMillis())
            .put("error", error == null ? null : error.getClass().getSimpleName())
            .put("error_message", error == null ? null : String.valueOf(error.getMessage()))
            .put("at_ms", elapsedMillis())
            .emit();
    }

    private long elapsedMillis() {
        return Duration.ofNanos(System.nanoTime() - startedAt).toMillis();
    }

    private static List<Integer> partitionNumbers(Collection<TopicPartition> partitions) {
        List<Integer> numbers = new ArrayList<>();
        partitions.forEach(partition -> numbers.add(partition.partition()));
        numbers.sort(null);
        return numbers;
    }

    private static List<List<Object>> topicPartitions(Collection<TopicPartition> partitions) {
        List<List<Object>> pairs = new ArrayList<>();
        partitions.forEach(partition -> pairs.add(List.of(partition.topic(), partition.partition())));
        return pairs;
    }

    /** Prints assignment changes; runs on the polling thread, inside poll(). */
    private final class AssignmentPrinter implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            lastProgressAt = System.nanoTime();
            print("assigned", partitions);
            if (printCommitted && !partitions.isEmpty()) {
                printCommittedOffsets(partitions);
            }
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            // Commit what was read of them first (the usual pattern: the next owner starts where this one stopped),
            // then stop committing them: their records now belong to another member.
            commitRevoked(partitions);
            partitions.forEach(consumed::remove);
            print("revoked", partitions);
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            partitions.forEach(consumed::remove);
            print("lost", partitions);
        }

        private void print(String kind, Collection<TopicPartition> partitions) {
            ConsumerGroupMetadata group = consumer.groupMetadata();
            Json.object()
                .put("type", kind)
                .put("partitions", partitionNumbers(partitions))
                .put("topic_partitions", topicPartitions(partitions))
                .put("generation", group.generationId())
                .put("member_id", group.memberId())
                .put("at_ms", elapsedMillis())
                .emit();
        }
    }
}
