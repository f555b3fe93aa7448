import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Sends --count string records, waits for every delivery report, and prints one JSON line per report
 * (in callback order, which Kafka keeps per partition) and then a summary line.
 *
 * Record i (from --start-index) has value value-prefix + i, key key-prefix + i (null without --key-prefix),
 * and one header per --header name=template, with "{i}" in the template replaced by i.
 * Sends stop at --deadline-ms after start; the records left are reported as "NotSent" errors.
 */
public final class KopProduce {
    private static final String INDEX_PLACEHOLDER = "{i}";

    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String topic = args.required("topic");
        int count = args.intValue("count", 0);
        int start = args.intValue("start-index", 0);
        String valuePrefix = args.optional("value-prefix", "");
        String keyPrefix = args.optional("key-prefix", null);
        Integer partition = args.has("partition") ? Integer.valueOf(args.required("partition")) : null;
        Map<String, String> headerTemplates = args.pairs("header");
        long deadline = System.nanoTime() + Duration.ofMillis(args.longValue("deadline-ms", 60_000)).toNanos();

        Properties props = args.clientProperties();
        props.putIfAbsent(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.putIfAbsent(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());

        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long startedAt = System.nanoTime();
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        try {
            for (int i = start; i < start + count; i++) {
                String key = keyPrefix == null ? null : keyPrefix + i;
                String value = valuePrefix + i;
                if (System.nanoTime() > deadline) {
                    failed.incrementAndGet();
                    report(i, key, value, null, "NotSent", "deadline passed before this record was sent");
                    continue;
                }
                ProducerRecord<String, String> record =
                    new ProducerRecord<>(topic, partition, key, value, headers(headerTemplates, i));
                int index = i;
                // send() reports most failures through the callback, some by throwing: count each record once.
                AtomicBoolean reported = new AtomicBoolean();
                try {
                    producer.send(record, (metadata, error) -> {
                        if (reported.compareAndSet(false, true)) {
                            (error == null ? acked : failed).incrementAndGet();
                            report(index, key, value, metadata, errorName(error), errorMessage(error));
                        }
                    });
                } catch (RuntimeException error) {
                    if (reported.compareAndSet(false, true)) {
                        failed.incrementAndGet();
                        report(index, key, value, null, errorName(error), errorMessage(error));
                    }
                }
            }
            // flush() returns once every sent record has a delivery report (bounded by delivery.timeout.ms).
            producer.flush();
        } finally {
            producer.close(Duration.ofSeconds(10));
        }
        Json.object()
            .put("type", "summary")
            .put("sent", count)
            .put("acked", acked.get())
            .put("failed", failed.get())
            .put("elapsed_ms", Duration.ofNanos(System.nanoTime() - startedAt).toMillis())
            .emit();
    }

    private static List<Header> headers(Map<String, String> templates, int index) {
        List<Header> headers = new ArrayList<>();
        templates.forEach((name, template) -> headers.add(new RecordHeader(
            name, template.replace(INDEX_PLACEHOLDER, Integer.toString(index)).getBytes(StandardCharsets.UTF_8))));
        return headers;
    }

    private static void report(int index, String key, String value, RecordMetadata metadata,
                               String error, String errorMessage) {
        boolean stored = error == null && metadata != null;
        Json.object()
            .put("type", "delivery")
            .put("index", index)
            .put("key", key)
            .put("value", value)
            .put("partition", metadata != null && metadata.partition() >= 0 ? metadata.partition() : null)
            .put("offset", stored && metadata.hasOffset() ? metadata.offset() : null)
            .put("timestamp", stored && metadata.hasTimestamp() ? metadata.timestamp() : null)
            .put("error", error)
            .put("error_message", errorMessage)
            .emit();
    }

    private static String errorName(Exception error) {
        return error == null ? null : error.getClass().getSimpleName();
    }

    private static String errorMessage(Exception error) {
        return error == null ? null : String.valueOf(error.getMessage());
    }
}
