import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;

/** The JSON line both consumers print for one record. */
final class RecordLines {
    private RecordLines() {
    }

    static void emit(ConsumerRecord<String, String> record) {
        List<List<String>> headers = new ArrayList<>();
        for (Header header : record.headers()) {
            String value = header.value() == null ? null : new String(header.value(), StandardCharsets.UTF_8);
            headers.add(java.util.Arrays.asList(header.key(), value));
        }
        Json.object()
            .put("type", "record")
            .put("topic", record.topic())
            .put("partition", record.partition())
            .put("offset", record.offset())
            .put("key", record.key())
            .put("value", record.value())
            .put("headers", headers)
            .put("timestamp", record.timestamp())
            .put("timestamp_type", record.timestampType().name)
            .emit();
    }
}
