//! The trace ids, span ids and sampling decisions the agent must produce, worked out
//! OUTSIDE the agent's code, from what docs/traces.md documents:
//!
//! * ids by a Python process (`hashlib`) that follows the documented recipe, kept
//!   running for the whole test binary and asked one line at a time; its trace id is
//!   checked once against the README's shell example (`printf %s "$ID" | sha256sum`);
//! * sampling by the OpenTelemetry SDK's own `TraceIdRatioBased` sampler on that trace
//!   id (the documented rule), not by a copy of the agent's formula.
//!
//! Needs `python3` and `sha256sum`: without them the tests FAIL.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use opentelemetry::trace::{SamplingDecision, SpanKind, TraceId};
use opentelemetry_sdk::trace::{Sampler, ShouldSample};

/// docs/traces.md, "Ids are derived, never random", in Python: reads
/// `kind \t service \t event id \t attempt` lines, answers `trace \t span`.
const RECIPE: &str = r#"
import hashlib, struct, sys
for line in sys.stdin:
    kind, service, event_id, attempt = line.rstrip("\n").split("\t")
    trace = hashlib.sha256(event_id.encode()).hexdigest()[:32]
    h = hashlib.sha256()
    for part in (kind.encode(), service.encode(), event_id.encode()):
        h.update(struct.pack(">Q", len(part)))
        h.update(part)
    h.update(struct.pack(">I", int(attempt)))
    print(trace + "\t" + h.hexdigest()[:16], flush=True)
"#;

struct Oracle {
    _child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

fn oracle() -> &'static Mutex<Oracle> {
    static ORACLE: OnceLock<Mutex<Oracle>> = OnceLock::new();
    ORACLE.get_or_init(|| {
        let mut child = Command::new("python3")
            .args(["-c", RECIPE])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("python3 is needed to work out the expected ids independently: {e}")
            });
        let input = child.stdin.take().expect("piped stdin");
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        let oracle = Mutex::new(Oracle {
            _child: child,
            input,
            output,
        });
        check_against_the_shell(&oracle);
        oracle
    })
}

/// The README's recipe for the trace id, run by the shell, agrees with the oracle.
fn check_against_the_shell(oracle: &Mutex<Oracle>) {
    let id = "order-42/ünïcode";
    let out = Command::new("sh")
        .args(["-c", "printf %s \"$1\" | sha256sum | cut -c1-32", "sh", id])
        .output()
        .unwrap_or_else(|e| panic!("sh / sha256sum are needed: {e}"));
    assert!(out.status.success(), "sha256sum failed: {out:?}");
    let shell = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (python, _) = ask(oracle, "process", "svc", id, 1);
    assert_eq!(
        python, shell,
        "the Python recipe's trace id differs from the README's shell recipe"
    );
}

fn ask(
    oracle: &Mutex<Oracle>,
    kind: &str,
    service: &str,
    event_id: &str,
    attempt: u32,
) -> (String, String) {
    for part in [kind, service, event_id] {
        assert!(
            !part.contains(['\t', '\n']),
            "the id oracle takes no tabs or newlines: {part:?}"
        );
    }
    let mut o = oracle.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(o.input, "{kind}\t{service}\t{event_id}\t{attempt}").expect("write to python3");
    let mut line = String::new();
    o.output.read_line(&mut line).expect("read from python3");
    let (trace, span) = line
        .trim_end()
        .split_once('\t')
        .unwrap_or_else(|| panic!("python3 answered {line:?}"));
    (trace.to_string(), span.to_string())
}

/// The trace id of an event, in lower-case hex.
pub fn trace_of(event_id: &str) -> String {
    ask(oracle(), "process", "-", event_id, 0).0
}

/// The span id of (`process` or `publish`, service, event id, attempt), in hex.
pub fn span_of(kind: &str, service: &str, event_id: &str, attempt: u32) -> String {
    ask(oracle(), kind, service, event_id, attempt).1
}

/// Whether the OpenTelemetry SDK's `TraceIdRatioBased(ratio)` keeps the event's trace.
pub fn sampled(event_id: &str, ratio: f64) -> bool {
    let trace = TraceId::from_hex(&trace_of(event_id)).expect("a 32-digit hex trace id");
    let result = Sampler::TraceIdRatioBased(ratio).should_sample(
        None,
        trace,
        "process",
        &SpanKind::Consumer,
        &[],
        &[],
    );
    matches!(result.decision, SamplingDecision::RecordAndSample)
}
