import org.apache.kafka.common.utils.AppInfoParser;

/** Prints the kafka-clients version on the classpath; needs no broker. */
public final class KopVersion {
    public static void main(String[] argv) {
        Json.object()
            .put("type", "version")
            .put("kafka_clients", AppInfoParser.getVersion())
            .put("commit", AppInfoParser.getCommitId())
            .put("java", System.getProperty("java.version"))
            .emit();
    }
}
