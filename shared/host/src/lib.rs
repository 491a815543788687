//! What every binary's `main` does the same way: logging, tracing export and the async runtime.
//!
//! Logs go to stderr, filtered by `DELTA_LOG`. When `OTEL_EXPORTER_OTLP_ENDPOINT` is set, spans
//! are also exported over OTLP (gRPC) to that collector; otherwise nothing is exported and no
//! exporter runs. Either way a run's W3C `traceparent` travels on its NATS messages: with export on
//! the worker's own span becomes the parent of the next hop, with it off the incoming one is passed
//! through unchanged, so a trace is never cut by a host that does not export.
//!
//! `DELTA_SPANS_FILE=<path>` writes every finished span as one line of text to that file instead
//! (what an OTLP exporter would send, without a collector): the end-to-end tests read it.
//!
//! The provider is also installed as OpenTelemetry's global one, for the spans a program builds
//! with OpenTelemetry's own API rather than through `tracing` (the gateway's `interaction` span
//! starts when a question was asked, in the past: [`tracer`]). Without export the global provider
//! stays the no-op one and those spans cost nothing.

pub mod http;
pub mod settings;

/// An error and its causes, for people and logs: `what failed: why: why that`. Errors in this
/// project say what failed in their own `Display` and keep the cause as `source()` (never both,
/// or the cause would print twice); whoever reports an error prints it through this.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'a));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            // Some errors (the redis client's) return a source that says the same again.
            let text = c.to_string();
            if text != last {
                write!(f, ": {text}")?;
                last = text;
            }
            cause = c.source();
        }
        Ok(())
    }
}

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Flushes exported spans when dropped (at the end of `main`).
#[must_use = "dropping it at once stops the span export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("warning: could not flush traces: {e}");
        }
    }
}

/// Writes each finished span, as the SDK hands it to an exporter (name, attributes, events,
/// status), as one line of text (`DELTA_SPANS_FILE`).
#[derive(Debug)]
struct FileSpanExporter(std::sync::Mutex<std::fs::File>);

impl opentelemetry_sdk::trace::SpanExporter for FileSpanExporter {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        use std::io::Write as _;
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for span in batch {
            let _ = writeln!(f, "{span:?}");
        }
        std::future::ready(Ok(()))
    }
}

/// Installs logging (`DELTA_LOG`, else `default`) and, when `OTEL_EXPORTER_OTLP_ENDPOINT` is
/// set, OTLP span export as `service` (or, with `DELTA_SPANS_FILE`, span lines to that file).
/// Call it once, with the runtime the binary will use.
pub fn init_logging(default: &str, service: &str, rt: &tokio::runtime::Runtime) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DELTA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // The MCP SDK logs whole results at debug (an answer link among them) and every refusal it
    // sends at warn (as many as callers like): only its errors, whatever DELTA_LOG says.
    let filter = match "rmcp=error".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    let spans_file = std::env::var_os("DELTA_SPANS_FILE").filter(|p| !p.is_empty());
    let provider = if let Some(path) = spans_file {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(file) => Some(
                SdkTracerProvider::builder()
                    .with_simple_exporter(FileSpanExporter(std::sync::Mutex::new(file)))
                    .build(),
            ),
            Err(e) => {
                eprintln!(
                    "warning: DELTA_SPANS_FILE={}: cannot write spans ({e}); going on without",
                    std::path::Path::new(&path).display()
                );
                None
            }
        }
    } else if endpoint.trim().is_empty() {
        None
    } else {
        // tonic's channel needs the runtime to exist when it is built.
        let _entered = rt.enter();
        match opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()
        {
            Ok(exporter) => Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name(service.to_owned())
                            .build(),
                    )
                    .build(),
            ),
            Err(e) => {
                eprintln!(
                    "warning: OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}: cannot export traces ({e}); \
                     going on without"
                );
                None
            }
        }
    };
    if let Some(p) = &provider {
        opentelemetry::global::set_tracer_provider(p.clone());
    }
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service.to_owned()))
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
    });
    use tracing_subscriber::Layer as _;
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init();
    Telemetry { provider }
}

/// Makes `span` a child of the trace in `traceparent` (a W3C header value), when there is one.
pub fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    // Fails only when the span is not exported (no OpenTelemetry layer): nothing to link then.
    let _ = span.set_parent(cx);
}

/// Makes `span` a child of the span in `cx`. Only before the span was first entered: the
/// parent of a span already started stays (then, or without export, this does nothing).
pub fn set_parent(span: &tracing::Span, cx: opentelemetry::Context) {
    let _ = span.set_parent(cx);
}

/// The trace context in `traceparent` (a W3C header value), to parent a span on; an empty
/// context (a new trace) when there is none or it does not parse.
pub fn remote_context(traceparent: Option<&str>) -> opentelemetry::Context {
    let Some(tp) = traceparent else {
        return opentelemetry::Context::new();
    };
    let carrier = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The `traceparent` of the span in `cx`, when that span is recorded (exported); `None` for a
/// context with no span or a span of the no-op provider (nothing exported).
pub fn traceparent_of(cx: &opentelemetry::Context) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    if !cx.span().is_recording() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The tracer of spans built with OpenTelemetry's API (the global provider's: see the crate
/// docs); a no-op one when nothing is exported.
pub fn tracer(service: &'static str) -> opentelemetry::global::BoxedTracer {
    opentelemetry::global::tracer(service)
}

/// The `traceparent` to write on messages sent from within `span`: the span itself when it is
/// exported, else `incoming` unchanged.
pub fn traceparent(span: &tracing::Span, incoming: Option<&str>) -> Option<String> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier
        .remove("traceparent")
        .or_else(|| incoming.map(str::to_owned))
}

/// A token cancelled on the first SIGINT or SIGTERM: a binary's shutdown trigger. Call it from
/// within the runtime.
pub fn shutdown_on_signals() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            tokio::select! { _ = int.recv() => {}, _ = term.recv() => {} }
            s.cancel();
        }
    });
    shutdown
}

/// Makes this process "not dumpable": no core dump, and no other process of the same user may
/// read its memory or its `/proc/<pid>/environ` or trace it. The fleet's programs hold secrets
/// (`DELTA_SECRETS_KEY`, their Redis and NATS logins, an LLM's key) and start agents' tools as
/// children of the same user: a tool's environment is cleared, and this keeps it from reading its
/// worker's anyway. A child that `exec`s a program is dumpable again, for itself. Only a process
/// with `CAP_SYS_PTRACE` (root) still can: run the fleet as a user of its own, not root.
pub fn protect_process() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_dumpable(false)
            .map_err(|e| format!("cannot make the process non-dumpable: {e}"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Ok(())
    }
}

/// The whole `main` of a fleet program (`delta-gateway`, `delta-worker`): `--help` prints the
/// settings `table`; the configuration comes from `args` and the environment through `parse`,
/// every bad value reported at once (exit 64); then logging (`DELTA_LOG`, `info` by default),
/// the runtime, and `run(config, shutdown)` until SIGINT or SIGTERM. Returns the exit code: 0,
/// 1 when `run` fails, 64 on bad configuration.
pub fn program_main<C, E, Fut>(
    name: &str,
    table: &[settings::Setting],
    args: Vec<String>,
    parse: impl FnOnce(&[String], &HashMap<String, String>) -> Result<C, Vec<String>>,
    run: impl FnOnce(C, tokio_util::sync::CancellationToken) -> Fut,
) -> i32
where
    Fut: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    if let Err(e) = protect_process() {
        eprintln!("error: {e}");
        return 1;
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprint!("{}", settings::usage(name, table));
        return 0;
    }
    let env = std::env::vars().collect();
    let config = match parse(&args, &env) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return 64;
        }
    };
    let rt = runtime();
    let telemetry = init_logging("info", name, &rt);
    let code = rt.block_on(async {
        // On a worker thread of the runtime, not on this one: what `run` awaits (a worker's
        // pulls, a gateway's listener) then wakes up on the thread that got its message and
        // spawns its work there, rather than waking this thread first and then another for the
        // work (docs/architecture.md#threads).
        let outcome = match tokio::spawn(run(config, shutdown_on_signals())).await {
            Ok(outcome) => outcome,
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => {
                    eprintln!("error: {e}");
                    return 1;
                }
            },
        };
        match outcome {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    });
    drop(telemetry);
    code
}

/// `DELTA_FAILPOINT`, read once: some failpoints are on hot paths (each resume, each answer).
fn failpoint_set() -> Option<&'static str> {
    static SET: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SET.get_or_init(|| std::env::var("DELTA_FAILPOINT").ok())
        .as_deref()
}

/// A test hook: `DELTA_FAILPOINT=<name>` makes the process exit hard at that point (as a crash
/// would), so tests can prove that what was left half done is mended (the gateway's
/// `answer:before-publish`, `cancel:before-announce` and `escalate:before-announce`, the
/// worker's `resume:before-write` and `exhausted:before-drop`).
pub fn failpoint(name: &str) {
    if failpoint_set() == Some(name) {
        eprintln!("failpoint {name}: exiting");
        std::process::exit(86);
    }
}

/// A test hook: `DELTA_FAILPOINT=<name>@<ms>` makes the process wait that long at that point,
/// so tests can land something in the window (the worker's `pause:before-announce`, between a
/// pause's write and its question's announcement).
pub async fn failpoint_delay(name: &str) {
    if let Some((at, ms)) = failpoint_set().and_then(|s| s.split_once('@'))
        && at == name
        && let Ok(ms) = ms.parse::<u64>()
    {
        eprintln!("failpoint {name}: waiting {ms} ms");
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

/// The multi-threaded runtime; on failure, says so and exits 1.
pub fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    /// What `program_main` does first: afterwards no other process of this user may read this
    /// one's memory or environment (Linux).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_protected_process_is_not_dumpable() {
        super::protect_process().expect("prctl");
        assert!(!nix::sys::prctl::get_dumpable().expect("prctl"));
    }

    #[test]
    fn a_chain_prints_each_cause_once() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(super::Chain(&e).to_string(), "outer: inner");
    }

    use super::*;

    #[test]
    fn without_export_the_incoming_traceparent_passes_through() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let span = tracing::info_span!("job");
        continue_trace(&span, Some(tp));
        assert_eq!(traceparent(&span, Some(tp)).as_deref(), Some(tp));
        assert_eq!(traceparent(&span, None), None);
    }
}
