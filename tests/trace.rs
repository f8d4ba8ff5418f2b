//! Trace context on the job (`Table::traceparent`, `Message::traceparent`,
//! `Delivery::traceparent`, `Job::traceparent`), on every database x form; with feature
//! `opentelemetry`, the trace continued across the queue.
//!
//! - A publish's traceparent reaches its delivery and the operator's `job`; a message without
//!   one reads `None`. Fails (`delivered`) with the column left out of the claimed row.
//! - `migrate` adds the column (and records the option) to a table made without it. Fails
//!   (`traceparent in`) with the column left out of `column_list`.
//! - A table without the option refuses a traceparent with `InvalidMessage`, and a malformed
//!   value is refused: nothing written. Fails (`refused`) without the checks of publish.
//! - With `opentelemetry`: a publish inside a span fills the row's traceparent from its send
//!   span, and the handler's span of `Subscription::run` continues the trace (same trace id,
//!   the send span its parent and its link), named and attributed by the messaging
//!   conventions. Fails (`same trace`) without the parent set in the handler's span.

mod common;

use std::time::Duration;

use common::{next, unique, Db};
use sqlbroker::{BrokerError, Form, JobState, Message, Table};

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// `t` in `form` (the advisory key reads a column unique per message).
fn in_form(t: Table, form: Form) -> Table {
    let name = t.name().to_string();
    let t = t.text_column("u");
    match form {
        Form::Lease => t.lease(Duration::from_secs(30)),
        Form::AdvisoryLock => t.advisory_lock(format!("{name}-{{u}}")),
        _ => t,
    }
}

fn message(body: &str) -> Message {
    Message::new(body.as_bytes().to_vec()).set("u", format!("{body}-{}", unique("u")))
}

/// A traceparent given at publish is delivered and shown by `job`, on a batch as on a single
/// publish; a message without one reads `None` (or, with an OpenTelemetry layer, its send
/// span's context).
fn traceparent_round_trip(db: Db, form: Form) {
    let Some(l) = common::live(db) else { return };
    let t = l.create(in_form(Table::new(unique("trc")).traceparent(), form));
    let traced = l
        .broker
        .publish(&t, message("traced").traceparent(TP))
        .unwrap();
    let plain = l.broker.publish(&t, message("plain")).unwrap();
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    l.broker
        .publish_batch(&t, [message("batch").traceparent(other)])
        .unwrap();
    let job = l.broker.job(&t, traced).unwrap().unwrap();
    assert_eq!(
        (job.state(), job.traceparent()),
        (JobState::Ready, Some(TP))
    );
    let unset = l
        .broker
        .job(&t, plain)
        .unwrap()
        .unwrap()
        .traceparent()
        .map(str::to_owned);
    // With `opentelemetry` and an OpenTelemetry layer (the one `otel` installs for this
    // process), a message without one takes its send span's context; without, none.
    match cfg!(feature = "opentelemetry") {
        true => assert!(unset.as_deref().is_none_or(|tp| tp != TP && tp.len() == 55)),
        false => assert_eq!(unset, None),
    }
    let sub = l.broker.subscription(&t).start().unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let d = next(&sub, Duration::from_secs(10));
        seen.push((d.payload().to_vec(), d.traceparent().map(str::to_owned)));
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
    seen.sort();
    assert_eq!(
        seen,
        [
            (b"batch".to_vec(), Some(other.to_string())),
            (b"plain".to_vec(), unset),
            (b"traced".to_vec(), Some(TP.to_string())),
        ],
        "delivered"
    );
}
per_db_form!(traceparent_round_trip);

/// `migrate` adds the column to a table made without it and records the option; the rows
/// already there read `None`.
fn migrate_adds_the_column(db: Db) {
    let Some(l) = common::live(db) else { return };
    let plain = l.create(in_form(Table::new(unique("trm")), Form::Lease));
    let old = l.broker.publish(&plain, message("old")).unwrap();
    let traced = in_form(Table::new(plain.name()).traceparent(), Form::Lease);
    assert!(matches!(
        l.broker.subscription(&traced).start(),
        Err(BrokerError::Schema { .. } | BrokerError::InvalidTable { .. })
    ));
    let done = l.broker.migrate(&traced).unwrap();
    assert!(
        done.iter().any(|d| d.contains("traceparent")),
        "traceparent in {done:?}"
    );
    assert!(l.broker.open_table(plain.name()).unwrap().has_traceparent());
    let new = l
        .broker
        .publish(&traced, message("new").traceparent(TP))
        .unwrap();
    let sub = l.broker.subscription(&traced).start().unwrap();
    for _ in 0..2 {
        let d = next(&sub, Duration::from_secs(10));
        let want = if d.id() == old { None } else { Some(TP) };
        assert!(d.id() == old || d.id() == new);
        assert_eq!(d.traceparent(), want, "row {}", d.id());
        d.ack().unwrap();
    }
    sub.shutdown(Duration::from_secs(10)).unwrap();
}
per_db!(migrate_adds_the_column);

/// A traceparent for a table without the column, or a malformed one, is refused with
/// `InvalidMessage` by publish and publish_batch alike, and nothing is written.
fn bad_traceparents_are_refused(db: Db) {
    let Some(l) = common::live(db) else { return };
    let plain = l.create(in_form(Table::new(unique("trp")), Form::Lease));
    let traced = l.create(in_form(
        Table::new(unique("trv")).traceparent(),
        Form::Lease,
    ));
    let refused = |r: sqlbroker::Result<()>, why: &str| match r {
        Err(BrokerError::InvalidMessage { reason, .. }) => {
            assert!(reason.contains(why), "{why:?} in {reason}")
        }
        other => panic!("refused: {other:?}"),
    };
    refused(
        l.broker
            .publish(&plain, message("x").traceparent(TP))
            .map(drop),
        "Table::traceparent",
    );
    refused(
        l.broker
            .publish_batch(&plain, [message("a"), message("b").traceparent(TP)])
            .map(drop),
        "Table::traceparent",
    );
    for (bad, why) in [
        ("", "0 bytes"),
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "bytes",
        ),
        (
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "trace id",
        ),
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "parent id",
        ),
        (
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
            "lowercase",
        ),
        (
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'); --",
            "bytes",
        ),
    ] {
        refused(
            l.broker
                .publish(&traced, message("x").traceparent(bad))
                .map(drop),
            why,
        );
        refused(
            l.broker
                .publish_batch(&traced, [message("a"), message("b").traceparent(bad)])
                .map(drop),
            why,
        );
    }
    assert_eq!((l.rows(&plain), l.rows(&traced)), (0, 0));
}
per_db!(bad_traceparents_are_refused);

#[cfg(feature = "opentelemetry")]
mod otel {
    use super::*;
    use std::sync::OnceLock;

    use opentelemetry::trace::{SpanKind, TraceContextExt, TracerProvider as _};
    use opentelemetry::Value;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    /// The process-wide subscriber with the OpenTelemetry layer over an in-memory exporter
    /// (the runner's threads see only a global subscriber), installed once.
    fn exporter() -> &'static InMemorySpanExporter {
        static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
        EXPORTER.get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("trace-test"));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("the only global subscriber");
            exporter
        })
    }

    fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| &kv.value)
    }

    /// The spans of table `t` named `name`.
    fn spans(t: &Table, name: &str) -> Vec<SpanData> {
        exporter()
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                attr(s, "messaging.destination.name") == Some(&Value::from(t.name().to_string()))
            })
            .collect()
    }

    /// A publish inside a request's span fills the row's traceparent from its send span (a
    /// child of the request); `Subscription::run`'s handler span continues that trace: the
    /// send span is its parent and its link, and both carry the messaging attributes.
    fn the_trace_crosses_the_queue(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        exporter();
        let t = l.create(in_form(Table::new(unique("tro")).traceparent(), form));
        let request = tracing::info_span!("request");
        let id = request
            .in_scope(|| l.broker.publish(&t, message("job")))
            .unwrap();
        let trace_id = request.context().span().span_context().trace_id();
        drop(request);
        let sub = l.broker.subscription(&t).start().unwrap();
        let delivered = parking_lot::Mutex::new(None);
        sub.run(1, |d| {
            *delivered.lock() = d.traceparent().map(str::to_owned);
            sub.close();
            Ok::<_, std::io::Error>(())
        })
        .unwrap();

        let send = spans(&t, &format!("send {}", t.name()));
        let process = spans(&t, &format!("process {}", t.name()));
        assert_eq!((send.len(), process.len()), (1, 1), "one span each");
        let (send, process) = (&send[0], &process[0]);
        let sc = &send.span_context;
        assert_eq!(
            sc.trace_id(),
            trace_id,
            "the send span is the request's child"
        );
        assert_eq!(
            delivered.lock().as_deref(),
            Some(format!("00-{}-{}-01", sc.trace_id(), sc.span_id()).as_str()),
            "the row carries the send span's context"
        );
        assert_eq!(
            process.span_context.trace_id(),
            trace_id,
            "same trace across the queue"
        );
        assert_eq!(process.parent_span_id, sc.span_id());
        assert!(process
            .links
            .links
            .iter()
            .any(|link| link.span_context.span_id() == sc.span_id()));
        assert_eq!(
            (send.span_kind.clone(), process.span_kind.clone()),
            (SpanKind::Producer, SpanKind::Consumer)
        );
        for (span, op) in [(send, "send"), (process, "process")] {
            assert_eq!(
                attr(span, "messaging.system"),
                Some(&Value::from("sqlbroker"))
            );
            assert_eq!(
                attr(span, "messaging.operation.type"),
                Some(&Value::from(op))
            );
            assert_eq!(
                attr(span, "messaging.message.id"),
                Some(&Value::from(id.to_string())),
                "{op}"
            );
        }
    }
    per_db_form!(the_trace_crosses_the_queue);

    /// `testing::drain` runs a handler as `Subscription::run` does, in a process span that
    /// continues the publisher's trace.
    #[cfg(feature = "testing")]
    fn a_drain_continues_the_trace(db: Db, form: Form) {
        let Some(l) = common::live(db) else { return };
        exporter();
        let t = l.create(in_form(Table::new(unique("trd")).traceparent(), form));
        let request = tracing::info_span!("request");
        request
            .in_scope(|| l.broker.publish(&t, message("job")))
            .unwrap();
        let trace_id = request.context().span().span_context().trace_id();
        drop(request);
        let ran =
            sqlbroker::testing::drain(&l.broker, &t, |_| Ok::<_, std::io::Error>(())).unwrap();
        assert_eq!(ran.acked, 1);
        let process = spans(&t, &format!("process {}", t.name()));
        assert_eq!(process.len(), 1, "one process span");
        assert_eq!(process[0].span_context.trace_id(), trace_id, "same trace");
        let send = spans(&t, &format!("send {}", t.name()));
        assert_eq!(process[0].parent_span_id, send[0].span_context.span_id());
    }
    #[cfg(feature = "testing")]
    per_db_form!(a_drain_continues_the_trace);
}
