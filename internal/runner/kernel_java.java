// Vivarium's Java kernel: one JVM per code context, started by kernels.py
// inside the sandbox (see its doc for the protocol) in source-file mode.
// Cells are evaluated by JShell, in this JVM (the "local" execution engine:
// no second JVM, no debugger connection): declarations live from one cell
// to the next, and the value of a cell's last expression is its result.
// An execution's environment variables are the JVM's for that execution:
// System.getenv and a ProcessBuilder's environment() see them (the map
// behind System.getenv is written through reflection, which kernels.py
// opens with --add-opens). A process started without its environment()
// being read inherits the JVM's environment as it started, which a JVM
// cannot change. They are system properties too, as in E2B's Java kernel,
// which sets only those; so are the sandbox's.

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;

import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.VarSnippet;

public class Kernel {
    static OutputStream events;
    static FileInputStream ack;

    public static void main(String[] args) throws Exception {
        String[] fds = System.getenv().getOrDefault("VIVARIUM_KERNEL_FDS", "").split(",");
        BufferedReader requests = new BufferedReader(new InputStreamReader(
                new FileInputStream("/proc/self/fd/" + fds[0]), StandardCharsets.UTF_8));
        events = new FileOutputStream("/proc/self/fd/" + fds[1]);
        ack = new FileInputStream("/proc/self/fd/" + fds[2]);
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            if (!e.getKey().equals("VIVARIUM_KERNEL_FDS") && System.getProperty(e.getKey()) == null) {
                System.setProperty(e.getKey(), e.getValue());
            }
        }
        JShell shell = JShell.builder().executionEngine("local").build();
        // An interrupt stops the running snippet; the JVM lives on.
        sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> shell.stop());
        String line;
        while ((line = requests.readLine()) != null) {
            String[] parts = line.trim().split(" ");
            if (parts.length < 2 || !parts[0].equals("cell")) {
                continue;
            }
            Map<String, String> env = new HashMap<>();
            for (int i = 2; i < parts.length; i++) {
                int eq = parts[i].indexOf('=');
                if (eq > 0) {
                    env.put(unhex(parts[i].substring(0, eq)), unhex(parts[i].substring(eq + 1)));
                }
            }
            runCell(shell, unhex(parts[1]), env);
        }
        System.exit(0);
    }

    static String unhex(String h) {
        return new String(HexFormat.of().parseHex(h), StandardCharsets.UTF_8);
    }

    // environ is the writable map behind System.getenv (and the
    // environment ProcessBuilder starts from), or null when the JVM does
    // not open it.
    static final Map<String, String> environ = openEnviron();

    @SuppressWarnings("unchecked")
    static Map<String, String> openEnviron() {
        try {
            Map<String, String> view = System.getenv();
            java.lang.reflect.Field f = view.getClass().getDeclaredField("m");
            f.setAccessible(true);
            return (Map<String, String>) f.get(view);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    // setEnv sets (or, for null, removes) one variable as a system property
    // and, when it can, in the environment.
    static void setEnv(String key, String value, String property) {
        if (property == null) {
            System.clearProperty(key);
        } else {
            System.setProperty(key, property);
        }
        if (environ != null) {
            if (value == null) {
                environ.remove(key);
            } else {
                environ.put(key, value);
            }
        }
    }

    static void runCell(JShell shell, String code, Map<String, String> env) throws Exception {
        Map<String, String[]> saved = new HashMap<>();
        for (Map.Entry<String, String> e : env.entrySet()) {
            saved.put(e.getKey(), new String[] {System.getenv(e.getKey()), System.getProperty(e.getKey())});
            setEnv(e.getKey(), e.getValue(), e.getValue());
        }
        int status = 0;
        String value = null;
        try {
            SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
            String rest = code;
            while (!rest.isBlank()) {
                SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
                String src = info.source();
                if (src == null || info.completeness() == SourceCodeAnalysis.Completeness.DEFINITELY_INCOMPLETE) {
                    sendError("CompilationException", "the cell ends in the middle of a statement", rest);
                    status = 1;
                    break;
                }
                rest = info.remaining();
                value = null;
                String failure = evalSnippet(shell, src);
                if (failure != null) {
                    status = 1;
                    break;
                }
                value = lastValue;
            }
        } finally {
            System.out.flush();
            System.err.flush();
            for (Map.Entry<String, String[]> e : saved.entrySet()) {
                setEnv(e.getKey(), e.getValue()[0], e.getValue()[1]);
            }
        }
        if (status == 0 && value != null) {
            send("{\"type\":\"result\",\"main\":true,\"data\":{\"text/plain\":" + json(value) + "}}");
            waitAck();
        }
        send("{\"type\":\"done\",\"code\":" + status + "}");
    }

    static String lastValue;

    // evalSnippet runs one snippet; it sends the error and returns its name
    // when the snippet failed.
    static String evalSnippet(JShell shell, String src) throws Exception {
        lastValue = null;
        List<SnippetEvent> evs = shell.eval(src);
        for (SnippetEvent ev : evs) {
            if (ev.causeSnippet() != null) {
                continue; // an update of another snippet
            }
            if (ev.status() == Snippet.Status.REJECTED) {
                String msg = shell.diagnostics(ev.snippet()).map(d -> d.getMessage(null))
                        .collect(Collectors.joining("\n"));
                sendError("CompilationException", msg, src);
                return "CompilationException";
            }
            if (ev.exception() != null) {
                Exception x = ev.exception();
                String name = x instanceof EvalException ee ? ee.getExceptionClassName() : x.getClass().getName();
                if (x instanceof UnresolvedReferenceException ure) {
                    name = "UnresolvedReferenceException";
                    sendError(name, "unresolved reference in " + ure.getSnippet().source(), src);
                    return name;
                }
                java.io.StringWriter tb = new java.io.StringWriter();
                x.printStackTrace(new java.io.PrintWriter(tb));
                String msg = x.getMessage() == null ? "" : x.getMessage();
                send("{\"type\":\"error\",\"name\":" + json(name) + ",\"value\":" + json(msg)
                        + ",\"traceback\":" + json(tb.toString()) + "}");
                return name;
            }
            Snippet s = ev.snippet();
            if (s.kind() == Snippet.Kind.VAR && s.subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND) {
                lastValue = display(ev.value(), ((VarSnippet) s).typeName());
            } else if (s.kind() == Snippet.Kind.EXPRESSION && ev.value() != null && !ev.value().isEmpty()) {
                lastValue = display(ev.value(), ((jdk.jshell.ExpressionSnippet) s).typeName());
            }
        }
        return null;
    }

    // display shows a String as its text, as a notebook does, and other
    // values as JShell prints them.
    static String display(String value, String type) {
        if (value == null) {
            return null;
        }
        if (type.equals("void")) {
            return null;
        }
        if (type.equals("String") && value.length() >= 2 && value.startsWith("\"") && value.endsWith("\"")) {
            return unescape(value.substring(1, value.length() - 1));
        }
        if (value.equals("null") && type.equals("String")) {
            return "null";
        }
        return value;
    }

    static String unescape(String s) {
        StringBuilder b = new StringBuilder();
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c != '\\' || i + 1 >= s.length()) {
                b.append(c);
                continue;
            }
            char n = s.charAt(++i);
            switch (n) {
                case 'n' -> b.append('\n');
                case 't' -> b.append('\t');
                case 'r' -> b.append('\r');
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case '0' -> b.append('\0');
                case 'u' -> {
                    if (i + 4 < s.length()) {
                        b.append((char) Integer.parseInt(s.substring(i + 1, i + 5), 16));
                        i += 4;
                    }
                }
                default -> b.append(n);
            }
        }
        return b.toString();
    }

    static void sendError(String name, String value, String src) throws Exception {
        send("{\"type\":\"error\",\"name\":" + json(name) + ",\"value\":" + json(value)
                + ",\"traceback\":" + json(name + ": " + value + "\n  in: " + src.strip() + "\n") + "}");
    }

    static void send(String line) throws Exception {
        System.out.flush();
        System.err.flush();
        events.write((line + "\n").getBytes(StandardCharsets.UTF_8));
        events.flush();
    }

    static void waitAck() throws Exception {
        int c;
        while ((c = ack.read()) != -1 && c != '\n') {
        }
        if (c == -1) {
            System.exit(0);
        }
    }

    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20 || (c >= 0xd800 && c <= 0xdfff)) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
