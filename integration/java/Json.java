import java.util.Map;

/**
 * Writes one JSON object by hand, so the harness needs nothing beyond kafka-clients.
 * Output is pure ASCII (everything else is \\u-escaped), whatever the platform encoding.
 */
final class Json {
    private final StringBuilder body = new StringBuilder();

    static Json object() {
        return new Json();
    }

    Json put(String name, Object value) {
        if (body.length() > 0) {
            body.append(',');
        }
        appendString(body, name);
        body.append(':');
        appendValue(body, value);
        return this;
    }

    /** Prints this object as one line of stdout; PrintStream.println is synchronized, so callback threads may call it. */
    void emit() {
        System.out.println(this);
    }

    @Override
    public String toString() {
        return "{" + body + "}";
    }

    private static void appendValue(StringBuilder out, Object value) {
        if (value == null) {
            out.append("null");
        } else if (value instanceof Json || value instanceof Number || value instanceof Boolean) {
            out.append(value);
        } else if (value instanceof Map<?, ?> map) {
            Json nested = new Json();
            map.forEach((key, item) -> nested.put(String.valueOf(key), item));
            out.append(nested);
        } else if (value instanceof Iterable<?> items) {
            out.append('[');
            boolean first = true;
            for (Object item : items) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                appendValue(out, item);
            }
            out.append(']');
        } else {
            appendString(out, value.toString());
        }
    }

    private static void appendString(StringBuilder out, String text) {
        out.append('"');
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                case '\n' -> out.append("\\n");
                case '\r' -> out.append("\\r");
                case '\t' -> out.append("\\t");
                default -> {
                    if (c < 0x20 || c > 0x7e) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
                }
            }
        }
        out.append('"');
    }
}
