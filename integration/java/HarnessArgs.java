import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.CommonClientConfigs;

/**
 * Command-line options as "--name value" pairs. Repeatable options (--prop, --header) take "key=value".
 * The Python side (integration/java_client.py) is the only intended caller.
 */
final class HarnessArgs {
    private final Map<String, List<String>> values = new HashMap<>();

    HarnessArgs(String[] argv) {
        if (argv.length % 2 != 0) {
            throw new IllegalArgumentException("options come in '--name value' pairs");
        }
        for (int i = 0; i < argv.length; i += 2) {
            if (!argv[i].startsWith("--")) {
                throw new IllegalArgumentException("expected an option name, got: " + argv[i]);
            }
            values.computeIfAbsent(argv[i].substring(2), name -> new ArrayList<>()).add(argv[i + 1]);
        }
    }

    boolean has(String name) {
        return values.containsKey(name);
    }

    String required(String name) {
        List<String> found = values.get(name);
        if (found == null) {
            throw new IllegalArgumentException("missing option --" + name);
        }
        return found.get(found.size() - 1);
    }

    String optional(String name, String fallback) {
        return has(name) ? required(name) : fallback;
    }

    long longValue(String name, long fallback) {
        return has(name) ? Long.parseLong(required(name)) : fallback;
    }

    int intValue(String name, int fallback) {
        return has(name) ? Integer.parseInt(required(name)) : fallback;
    }

    /** All values of a repeatable option, in the order given. */
    List<String> all(String name) {
        return values.getOrDefault(name, List.of());
    }

    /** All "key=value" values of a repeatable option, in the order given. */
    Map<String, String> pairs(String name) {
        Map<String, String> result = new LinkedHashMap<>();
        for (String pair : values.getOrDefault(name, List.of())) {
            int split = pair.indexOf('=');
            if (split <= 0) {
                throw new IllegalArgumentException("--" + name + " wants key=value, got: " + pair);
            }
            result.put(pair.substring(0, split), pair.substring(split + 1));
        }
        return result;
    }

    /** Client configuration: --bootstrap plus every --prop key=value. */
    Properties clientProperties() {
        Properties props = new Properties();
        props.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, required("bootstrap"));
        props.putAll(pairs("prop"));
        return props;
    }
}
