import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Writes rows the way Spark's built-in Kafka sink (KafkaWriteTask) does, through task failures and retries.
 *
 * As Spark configures it: byte-array serializers and the client's defaults otherwise (so idempotence on, acks=all);
 * one producer per executor, cached and reused by every task and by a task's retry (CachedKafkaProducer), so a
 * retried task is not a new producer; send() for each row with the row's key, value and headers, the first failed
 * send thrown by the next send; flush() and a last check before the task commits.
 *
 * Each of --tasks tasks writes --rows rows (row i: key "k{i}", value "row-{i}"); its first attempt fails after
 * --fail-after rows have been sent (Spark then retries it), and its retry writes all its rows again. With
 * --sequence-headers, row i of task t carries kop.producer.name "{job}/task-{t}" and kop.sequence.id i, as kop's
 * pipeline derives them from the input. Prints a summary: rows sent and acknowledged, attempts, failures.
 */
public final class KopSparkSinkRetry {
    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String topic = args.required("topic");
        String job = args.optional("job", "spark-job");
        int tasks = args.intValue("tasks", 4);
        int rows = args.intValue("rows", 1000);
        int failAfter = args.intValue("fail-after", rows * 6 / 10);
        boolean sequenceHeaders = Boolean.parseBoolean(args.optional("sequence-headers", "true"));

        Properties props = args.clientProperties();
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());

        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failedSends = new AtomicInteger();
        int sent = 0;
        int attempts = 0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int task = 0; task < tasks; task++) {
                for (int attempt = 0; ; attempt++) {
                    attempts++;
                    AtomicReference<Exception> failure = new AtomicReference<>();
                    try {
                        int first = task * rows;
                        for (int i = first; i < first + rows; i++) {
                            if (attempt == 0 && i - first == failAfter) {
                                throw new IllegalStateException("injected task failure");
                            }
                            checkForErrors(failure);
                            ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, null, null,
                                bytes("k" + i), bytes("row-" + i), headers(sequenceHeaders, job, task, i));
                            producer.send(record, (metadata, error) -> {
                                if (error == null) {
                                    acked.incrementAndGet();
                                } else {
                                    failedSends.incrementAndGet();
                                    failure.compareAndSet(null, error);
                                }
                            });
                            sent++;
                        }
                        producer.flush();
                        checkForErrors(failure);
                        break;  // the task committed
                    } catch (IllegalStateException injected) {
                        // Spark retries the task; the cached producer stays open, its sends still in flight.
                    }
                }
            }
            producer.flush();
        }
        Json.object()
            .put("type", "summary")
            .put("sent", sent)
            .put("acked", acked.get())
            .put("failed", failedSends.get())
            .put("attempts", attempts)
            .emit();
    }

    private static void checkForErrors(AtomicReference<Exception> failure) throws Exception {
        Exception error = failure.get();
        if (error != null) {
            throw error;
        }
    }

    private static List<Header> headers(boolean sequenceHeaders, String job, int task, int row) {
        List<Header> headers = new ArrayList<>();
        if (sequenceHeaders) {
            headers.add(new RecordHeader("kop.producer.name", bytes(job + "/task-" + task)));
            headers.add(new RecordHeader("kop.sequence.id", bytes(Integer.toString(row))));
        }
        return headers;
    }

    private static byte[] bytes(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    private KopSparkSinkRetry() {
    }
}
