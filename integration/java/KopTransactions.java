import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client's transactional producer against kop.
 *
 * --mode commit-abort: one transaction of --count records "c-{i}" committed, one of "a-{i}" aborted, then a second
 * producer with the same transactional.id fences the first, whose next commit must fail with
 * ProducerFencedException. Summary: committed, aborted, fenced.
 *
 * --mode timeout: a transaction of --count records "late-{i}" left open (past --transaction-timeout-ms) until a read_committed consumer sees the last stable offset pass them (the coordinator aborted
 * it), then committed. Summary: error (the commit's exception class, or null if it committed), cause (its cause's
 * class, or null).
 *
 * --mode spread: over --topics (name:partitions,...), one transaction with a record "a-{topic}-{p}" in every partition,
 * aborted, then one with "c-{topic}-{p}" committed. Summary: records (per transaction).
 *
 * --mode copy: the consume-transform-produce loop. A read_committed consumer in --group reads --input from the
 * group's committed offset; every --batch records are written to --output as "out-{value}" in one transaction with
 * the consumed offsets (sendOffsetsToTransaction), until --count records are copied or --deadline-s passes. A
 * transaction that fails (the broker killed, say) is aborted and the consumer goes back to the group's committed
 * offsets. Summary: copied, transactions, aborts.
 */
public final class KopTransactions {
    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String mode = args.required("mode");
        if (mode.equals("commit-abort")) {
            commitAbort(args);
        } else if (mode.equals("timeout")) {
            timeout(args);
        } else if (mode.equals("spread")) {
            spread(args);
        } else if (mode.equals("copy")) {
            copy(args);
        } else {
            throw new IllegalArgumentException("unknown mode " + mode);
        }
    }

    private static KafkaProducer<byte[], byte[]> producer(HarnessArgs args, String transactionalId) {
        Properties props = args.clientProperties();
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        if (args.has("transaction-timeout-ms")) {
            props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, args.required("transaction-timeout-ms"));
        }
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props);
        producer.initTransactions();
        return producer;
    }

    private static void commitAbort(HarnessArgs args) {
        String topic = args.required("topic");
        String transactionalId = args.required("transactional-id");
        int count = args.intValue("count", 10);
        KafkaProducer<byte[], byte[]> first = producer(args, transactionalId);
        first.beginTransaction();
        for (int i = 0; i < count; i++) {
            first.send(new ProducerRecord<>(topic, 0, null, bytes("c-" + i)));
        }
        first.commitTransaction();
        first.beginTransaction();
        for (int i = 0; i < count; i++) {
            first.send(new ProducerRecord<>(topic, 0, null, bytes("a-" + i)));
        }
        first.flush();  // stored, then aborted (unsent records an abort would just drop)
        first.abortTransaction();

        boolean fenced = false;
        try (KafkaProducer<byte[], byte[]> second = producer(args, transactionalId)) {
            try {
                first.beginTransaction();
                first.send(new ProducerRecord<>(topic, 0, null, bytes("zombie")));
                first.commitTransaction();
            } catch (ProducerFencedException expected) {
                fenced = true;
            } catch (org.apache.kafka.common.KafkaException wrapped) {
                fenced = wrapped.getCause() instanceof ProducerFencedException;
            }
        } finally {
            first.close(Duration.ZERO);
        }
        Json.object().put("type", "summary").put("committed", count).put("aborted", count).put("fenced", fenced)
            .emit();
    }

    private static void spread(HarnessArgs args) {
        int records = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer(args, args.required("transactional-id"))) {
            for (String outcome : new String[] {"a", "c"}) {
                producer.beginTransaction();
                records = 0;
                for (String spec : args.required("topics").split(",")) {
                    String[] nameAndCount = spec.split(":");
                    for (int p = 0; p < Integer.parseInt(nameAndCount[1]); p++) {
                        String value = outcome + "-" + nameAndCount[0] + "-" + p;
                        producer.send(new ProducerRecord<>(nameAndCount[0], p, null, bytes(value)));
                        records++;
                    }
                }
                if (outcome.equals("a")) {
                    producer.flush();  // stored, then aborted (unsent records an abort would just drop)
                    producer.abortTransaction();
                } else {
                    producer.commitTransaction();
                }
            }
        }
        Json.object().put("type", "summary").put("records", records).emit();
    }

    private static void timeout(HarnessArgs args) throws InterruptedException {
        String topic = args.required("topic");
        int count = args.intValue("count", 2);
        String error = null;
        String cause = null;
        try (KafkaProducer<byte[], byte[]> producer = producer(args, args.required("transactional-id"))) {
            producer.beginTransaction();
            for (int i = 0; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, 0, null, bytes("late-" + i)));
            }
            producer.flush();
            // The records, then the coordinator's ABORT marker: the last stable offset passes both.
            waitForLastStableOffset(args, new TopicPartition(topic, 0), count + 1);
            try {
                producer.commitTransaction();
            } catch (org.apache.kafka.common.KafkaException failed) {
                error = failed.getClass().getSimpleName();
                cause = failed.getCause() == null ? null : failed.getCause().getClass().getSimpleName();
            }
        }
        Json.object().put("type", "summary").put("error", error).put("cause", cause).emit();
    }

    private static void waitForLastStableOffset(HarnessArgs args, TopicPartition partition, long expected)
            throws InterruptedException {
        Properties props = args.clientProperties();
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        long deadline = System.currentTimeMillis() + 1000L * args.intValue("deadline-s", 30);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = Collections.singletonList(partition);
            while (consumer.endOffsets(partitions).get(partition) < expected) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("the last stable offset of " + partition + " never reached "
                        + expected);
                }
                Thread.sleep(50);
            }
        }
    }

    private static void copy(HarnessArgs args) {
        String input = args.required("input");
        String output = args.required("output");
        String group = args.required("group");
        int count = args.intValue("count", 100);
        int batch = args.intValue("batch", 10);
        Properties consumerProps = args.clientProperties();
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        int copied = 0;
        int transactions = 0;
        int aborts = 0;
        long deadline = System.currentTimeMillis() + 1000L * args.intValue("deadline-s", 120);
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps);
             KafkaProducer<byte[], byte[]> producer = producer(args, group + "-copier")) {
            consumer.subscribe(Collections.singletonList(input));
            while (copied < count && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                List<ConsumerRecord<byte[], byte[]>> polled = new java.util.ArrayList<>();
                records.forEach(polled::add);
                for (int from = 0; from < polled.size(); from += batch) {  // one transaction per --batch records
                    List<ConsumerRecord<byte[], byte[]>> chunk = polled.subList(from, Math.min(from + batch, polled.size()));
                    try {
                        copyInOneTransaction(producer, consumer, chunk, output);
                        transactions++;
                        copied += chunk.size();
                    } catch (ProducerFencedException fatal) {
                        throw fatal;
                    } catch (org.apache.kafka.common.KafkaException failed) {
                        // The broker went away or answered an abortable error: abort, and read again from what the
                        // group has committed (the transactions that did commit), as an exactly-once loop must.
                        aborts++;
                        if (aborts <= 5 || aborts % 50 == 0) {
                            Json.object().put("type", "abort").put("error", failed.toString()).emit();
                        }
                        abortQuietly(producer);
                        rewind(consumer);
                        break;
                    }
                }
            }
        }
        Json.object().put("type", "summary").put("copied", copied).put("transactions", transactions)
            .put("aborts", aborts).emit();
    }

    private static void copyInOneTransaction(KafkaProducer<byte[], byte[]> producer,
                                             KafkaConsumer<byte[], byte[]> consumer,
                                             List<ConsumerRecord<byte[], byte[]>> chunk, String output) {
        producer.beginTransaction();
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (ConsumerRecord<byte[], byte[]> record : chunk) {
            String value = new String(record.value(), StandardCharsets.UTF_8);
            producer.send(new ProducerRecord<>(output, record.partition(), null, bytes("out-" + value)));
            offsets.put(new TopicPartition(record.topic(), record.partition()), new OffsetAndMetadata(record.offset() + 1));
        }
        producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
        for (int attempt = 0; ; attempt++) {
            try {
                producer.commitTransaction();
                return;
            } catch (org.apache.kafka.common.errors.TimeoutException slow) {
                if (attempt >= 5) {
                    throw slow;  // a commit that timed out may be retried (KIP-691); give up after a few
                }
            }
        }
    }

    private static void abortQuietly(KafkaProducer<byte[], byte[]> producer) {
        for (int attempt = 0; attempt < 5; attempt++) {
            try {
                producer.abortTransaction();
                return;
            } catch (org.apache.kafka.common.errors.TimeoutException slow) {
                // the broker is still away: try again
            }
        }
    }

    private static void rewind(KafkaConsumer<byte[], byte[]> consumer) {
        java.util.Set<TopicPartition> assigned = consumer.assignment();
        Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(assigned, Duration.ofSeconds(60));
        for (TopicPartition partition : assigned) {
            OffsetAndMetadata at = committed.get(partition);
            if (at == null) {
                consumer.seekToBeginning(Collections.singletonList(partition));
            } else {
                consumer.seek(partition, at.offset());
            }
        }
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }
}
