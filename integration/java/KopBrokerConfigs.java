import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.AlterConfigsOptions;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.common.config.ConfigResource;

/**
 * What kafka-configs.sh does to a broker's configs, through the Java AdminClient: incrementalAlterConfigs of the
 * resource --broker (a node id, or "" for the cluster-wide default, as --entity-default) with every --set key=value
 * and --delete key (--validate-only true: only checked), then describeConfigs of it with synonyms. Prints one
 * "summary" JSON line: "error" (the alter's exception class and message, or "none") and "configs" (name -> value,
 * source, read_only, synonyms as [name, value, source]). Options: --bootstrap, --broker, [--set k=v], [--delete k],
 * [--validate-only true|false], [--prop k=v].
 */
public final class KopBrokerConfigs {
    public static void main(String[] argv) throws Exception {
        HarnessArgs args = new HarnessArgs(argv);
        ConfigResource resource = new ConfigResource(ConfigResource.Type.BROKER, args.required("broker"));
        List<AlterConfigOp> ops = new ArrayList<>();
        args.pairs("set").forEach((key, value) ->
            ops.add(new AlterConfigOp(new ConfigEntry(key, value), AlterConfigOp.OpType.SET)));
        for (String key : args.all("delete")) {
            ops.add(new AlterConfigOp(new ConfigEntry(key, ""), AlterConfigOp.OpType.DELETE));
        }
        try (Admin admin = Admin.create(args.clientProperties())) {
            String error = "none";
            if (!ops.isEmpty()) {
                AlterConfigsOptions options = new AlterConfigsOptions()
                    .validateOnly(Boolean.parseBoolean(args.optional("validate-only", "false")));
                Map<ConfigResource, Collection<AlterConfigOp>> changes = Map.of(resource, ops);
                try {
                    admin.incrementalAlterConfigs(changes, options).all().get(30, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    error = e.getCause().getClass().getSimpleName() + ": " + e.getCause().getMessage();
                }
            }
            Config config = admin.describeConfigs(List.of(resource), new DescribeConfigsOptions().includeSynonyms(true))
                .all().get(30, TimeUnit.SECONDS).get(resource);
            Map<String, Object> configs = new LinkedHashMap<>();
            for (ConfigEntry entry : config.entries()) {
                List<Object> synonyms = new ArrayList<>();
                entry.synonyms().forEach(s ->
                    synonyms.add(List.of(s.name(), String.valueOf(s.value()), s.source().name())));
                configs.put(entry.name(), Map.of("value", String.valueOf(entry.value()),
                    "source", entry.source().name(), "read_only", entry.isReadOnly(), "synonyms", synonyms));
            }
            Json.object().put("type", "summary").put("error", error).put("configs", configs).emit();
        }
    }
}
