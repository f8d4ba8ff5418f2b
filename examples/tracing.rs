//! Tracing across the queue: a request's span publishes a job, a handler on another thread
//! works it, and the two halves are one trace.
//!
//! The table stores each row's W3C `traceparent` (`Table::traceparent`). With the
//! `opentelemetry` feature, `publish` fills it from its `send jobs` span (a child of the
//! request's span), and `Subscription::run` starts its `process jobs` span with that context as
//! its parent and its link. The spans are printed to stdout by OpenTelemetry's stdout exporter:
//! `request`, `send jobs` and `process jobs` show the same trace id.
//!
//! Run it with `cargo run --example tracing --features opentelemetry`.

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use sqlbroker::{Broker, Message, Table};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Spans go to stdout as each ends. The subscriber is global: the runner's handler
    // threads report to it too.
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(opentelemetry_stdout::SpanExporter::default())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("tracing-example"));
    // Info and above: the spans of publishes, requests and handlers (claims and settlements
    // are debug spans).
    let subscriber = tracing_subscriber::registry()
        .with(tracing_subscriber::filter::LevelFilter::INFO)
        .with(layer);
    tracing::subscriber::set_global_default(subscriber)?;

    let dir = std::env::temp_dir().join(format!("sqlbroker-tracing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let broker = Broker::connect(&format!("sqlite:{}", dir.join("jobs.db").display()))?;
    let jobs = Table::new("jobs")
        .traceparent()
        .lease(std::time::Duration::from_secs(30));
    broker.create_table(&jobs)?;

    // The producer: a request's span, inside which the job is published.
    let request = tracing::info_span!("request", http.route = "/signup");
    let id = request.in_scope(|| broker.publish(&jobs, Message::new(b"welcome mail".to_vec())))?;
    let trace_id = request.context().span().span_context().trace_id();
    drop(request);
    println!("published job {id} in trace {trace_id}");

    // The consumer: one handler thread; its `process jobs` span continues the trace.
    let sub = broker.subscription(&jobs).start()?;
    sub.run(1, |d| {
        println!(
            "handling job {} (traceparent {})",
            d.id(),
            d.traceparent().unwrap_or("-")
        );
        tracing::info!("sending the welcome mail");
        sub.close();
        Ok::<_, std::io::Error>(())
    })?;

    provider.shutdown()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
