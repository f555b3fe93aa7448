package org.slf4j.impl;

import java.io.PrintWriter;
import java.io.StringWriter;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.time.LocalTime;
import java.time.temporal.ChronoUnit;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.slf4j.ILoggerFactory;
import org.slf4j.Logger;
import org.slf4j.Marker;
import org.slf4j.helpers.FormattingTuple;
import org.slf4j.helpers.MessageFormatter;
import org.slf4j.spi.LoggerFactoryBinder;

/**
 * A minimal SLF4J 1.7 binding, found by slf4j-api under this fixed class name. The wheel ships slf4j-api with no
 * binding; without one the client's own warnings would be dropped. Here they go to stderr (stdout carries only the
 * harness's JSON lines) at or above the level named by the KOP_JAVA_LOG environment variable:
 * trace, debug, info, warn (the default), error or off.
 */
public final class StaticLoggerBinder implements LoggerFactoryBinder {
    /** Read by slf4j-api's version check; not final, so that javac does not inline it there. */
    public static String REQUESTED_API_VERSION = "1.6.99";

    // Before SINGLETON: static fields initialise in order, and the constructor reads LEVELS.
    private static final List<String> LEVELS = List.of("trace", "debug", "info", "warn", "error", "off");
    private static final StaticLoggerBinder SINGLETON = new StaticLoggerBinder();

    private final StderrLoggerFactory factory = new StderrLoggerFactory(thresholdFromEnvironment());

    public static StaticLoggerBinder getSingleton() {
        return SINGLETON;
    }

    @Override
    public ILoggerFactory getLoggerFactory() {
        return factory;
    }

    @Override
    public String getLoggerFactoryClassStr() {
        return StderrLoggerFactory.class.getName();
    }

    private static int thresholdFromEnvironment() {
        String wanted = System.getenv().getOrDefault("KOP_JAVA_LOG", "warn").toLowerCase(Locale.ROOT);
        int level = LEVELS.indexOf(wanted);
        return level >= 0 ? level : LEVELS.indexOf("warn");
    }

    /** One logger per name; each is a proxy, since slf4j's Logger interface has some sixty overloads. */
    static final class StderrLoggerFactory implements ILoggerFactory {
        private final int threshold;
        private final Map<String, Logger> loggers = new ConcurrentHashMap<>();

        StderrLoggerFactory(int threshold) {
            this.threshold = threshold;
        }

        @Override
        public Logger getLogger(String name) {
            return loggers.computeIfAbsent(name, this::newLogger);
        }

        private Logger newLogger(String name) {
            String shortName = name.substring(name.lastIndexOf('.') + 1);
            return (Logger) Proxy.newProxyInstance(Logger.class.getClassLoader(), new Class<?>[] {Logger.class},
                (proxy, method, args) -> call(proxy, name, shortName, method, args));
        }

        private Object call(Object proxy, String name, String shortName, Method method, Object[] args) {
            String methodName = method.getName();
            switch (methodName) {
                case "getName":
                    return name;
                case "toString":
                    return "StderrLogger[" + name + "]";
                case "hashCode":
                    return System.identityHashCode(proxy);
                case "equals":
                    return proxy == args[0];
                default:
                    break;
            }
            if (methodName.startsWith("is") && methodName.endsWith("Enabled")) {
                return levelOf(methodName.substring(2, methodName.length() - "Enabled".length())) >= threshold;
            }
            int level = levelOf(methodName);
            if (level >= threshold) {
                write(methodName, shortName, method, args);
            }
            return null;
        }

        private static int levelOf(String name) {
            return LEVELS.indexOf(name.toLowerCase(Locale.ROOT));
        }

        /** args are (Marker?, String format, arguments...), the arguments either spread out or as one varargs array. */
        private static void write(String level, String shortName, Method method, Object[] args) {
            int first = args[0] instanceof Marker ? 1 : 0;
            String format = (String) args[first];
            Object[] arguments = Arrays.copyOfRange(args, first + 1, args.length);
            if (method.isVarArgs()) {
                arguments = (Object[]) arguments[arguments.length - 1];
            }
            FormattingTuple message = MessageFormatter.arrayFormat(format, arguments);
            StringBuilder line = new StringBuilder()
                .append(LocalTime.now().truncatedTo(ChronoUnit.MILLIS)).append(' ')
                .append(level.toUpperCase(Locale.ROOT)).append(" [")
                .append(Thread.currentThread().getName()).append("] ")
                .append(shortName).append(": ")
                .append(message.getMessage());
            if (message.getThrowable() != null) {
                StringWriter trace = new StringWriter();
                message.getThrowable().printStackTrace(new PrintWriter(trace));
                line.append(System.lineSeparator()).append(trace.toString().stripTrailing());
            }
            System.err.println(line);
        }
    }
}
