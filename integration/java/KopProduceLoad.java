import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A load for benchmarks (bench/produce.py): --count records of --size bytes, record i to partition i % --partitions,
 * as fast as the producer takes them, with --headers none, "sequence" (kop.producer.name "bench/java/{partition}"
 * and kop.sequence.id i) or "plain" (two headers as large that kop does not read). A client far cheaper per record
 * than a Python loop, so that the broker sets the pace.
 *
 * It warms up (one record per partition), prints {"type": "ready"}, waits for a line on standard input, then sends
 * and flushes, and prints a summary: acked, failed, seconds, its own CPU seconds, and ack latency percentiles.
 */
public final class KopProduceLoad {
    private static final int PAYLOAD_POOL = 256;

    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        String topic = args.required("topic");
        int count = args.intValue("count", 0);
        int size = args.intValue("size", 100);
        int partitions = args.intValue("partitions", 1);
        String headerKind = args.optional("headers", "none");
        String nameKey = headerKind.equals("sequence") ? "kop.producer.name" : "app.producer.name";
        String idKey = headerKind.equals("sequence") ? "kop.sequence.id" : "app.sequence.id";
        byte[][] values = payloads(size);
        byte[][] names = new byte[partitions][];
        for (int p = 0; p < partitions; p++) {
            names[p] = ("bench/java/" + p).getBytes(StandardCharsets.UTF_8);
        }

        var props = args.clientProperties();
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        var osBean = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        long[] latencies = new long[count];
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (int p = 0; p < partitions; p++) {
                producer.send(new ProducerRecord<>(topic, p, null, "warm-up".getBytes(StandardCharsets.UTF_8)));
            }
            producer.flush();
            Json.object().put("type", "ready").emit();
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
            long cpuBefore = osBean.getProcessCpuTime();
            long startedAt = System.nanoTime();
            for (int i = 0; i < count; i++) {
                int partition = i % partitions;
                Header[] headers = headerKind.equals("none") ? null : new Header[] {
                    new RecordHeader(nameKey, names[partition]),
                    new RecordHeader(idKey, Integer.toString(i).getBytes(StandardCharsets.UTF_8))};
                long sentAt = System.nanoTime();
                int index = i;
                producer.send(new ProducerRecord<>(topic, partition, null, null, values[i % PAYLOAD_POOL],
                                                   headers == null ? null : Arrays.asList(headers)),
                    (metadata, error) -> {
                        if (error == null) {
                            latencies[index] = System.nanoTime() - sentAt;
                            acked.incrementAndGet();
                        } else {
                            failed.incrementAndGet();
                        }
                    });
            }
            producer.flush();
            long elapsed = System.nanoTime() - startedAt;
            long cpu = osBean.getProcessCpuTime() - cpuBefore;
            long[] sorted = latencies.clone();
            Arrays.sort(sorted);
            Json.object()
                .put("type", "summary")
                .put("acked", acked.get())
                .put("failed", failed.get())
                .put("seconds", elapsed / 1e9)
                .put("cpu_s", cpu / 1e9)
                .put("p50_ms", count == 0 ? 0.0 : sorted[(int) (count * 0.50)] / 1e6)
                .put("p99_ms", count == 0 ? 0.0 : sorted[Math.min(count - 1, (int) (count * 0.99))] / 1e6)
                .emit();
        }
    }

    /** Values about half compressible, as bench/produce.py makes them: random bytes, then repeated text. */
    private static byte[][] payloads(int size) {
        Random random = new Random(7);
        byte[] text = "kop benchmark record ".repeat(size / 21 + 1).getBytes(StandardCharsets.UTF_8);
        byte[][] values = new byte[PAYLOAD_POOL][];
        for (int v = 0; v < PAYLOAD_POOL; v++) {
            byte[] value = new byte[size];
            byte[] half = new byte[size / 2];
            random.nextBytes(half);
            System.arraycopy(half, 0, value, 0, half.length);
            System.arraycopy(text, 0, value, half.length, size - half.length);
            values[v] = value;
        }
        return values;
    }
}
