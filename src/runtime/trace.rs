//! Feature `tracing`: the spans of a publish and of a handled delivery, named and attributed
//! by OpenTelemetry's messaging conventions; with feature `opentelemetry`, the trace context a
//! row carries ([`Table::traceparent`](crate::Table::traceparent)) written from the current
//! span at publish and continued by the handler's span. No type of the tracing crates leaves
//! the library.
//!
//! The conventions' names (semantic conventions for messaging spans, experimental): the span
//! is named `{messaging.operation.name} {messaging.destination.name}` (`send jobs`,
//! `process jobs`), with `messaging.system` (`sqlbroker`: the conventions register no value for
//! a queue on an SQL table), `messaging.operation.type` (`send`, `process`),
//! `messaging.operation.name`, `messaging.destination.name` (the table) and
//! `messaging.message.id` (the row's id). `otel.name` and `otel.kind` are the fields the
//! `tracing-opentelemetry` layer reads as the OpenTelemetry span's name and kind; the
//! `tracing` names stay `sqlbroker.publish` and `sqlbroker.delivery`.

/// The span of a publish of `count` messages to `table` (current while the rows are
/// inserted, so a trace context filled at publish is this span's): kind producer. A publish
/// of one message records its id ([`record_id`]) once the row is made; a batch records its
/// size (`messaging.batch.message_count`).
pub(crate) fn send_span(table: &str, count: usize) -> tracing::Span {
    let span = tracing::info_span!(
        "sqlbroker.publish",
        otel.name = %format_args!("send {table}"),
        otel.kind = "producer",
        messaging.system = "sqlbroker",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = %table,
        messaging.batch.message_count = tracing::field::Empty,
        messaging.message.id = tracing::field::Empty,
    );
    if count > 1 {
        span.record("messaging.batch.message_count", count);
    }
    span
}

/// Records the id of the row a publish made on its span.
pub(crate) fn record_id(span: &tracing::Span, id: i64) {
    span.record("messaging.message.id", id.to_string());
}

/// The span of a delivery's handler ([`Subscription::run`](crate::Subscription::run) and the
/// `testing` drains): kind consumer, the existing fields (`table`, `id`, `attempt`) beside
/// the conventions'. With feature `opentelemetry` and a valid `traceparent` on the row, the
/// span links to the publish's span context, and takes it as its parent where no span is
/// current (a runner's thread): the trace goes on across the queue. Where a span is current
/// (a drain inside a test's span), it stays the parent and the link alone leads back.
pub(crate) fn process_span(
    table: &str,
    id: i64,
    attempt: u32,
    traceparent: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "sqlbroker.delivery",
        table = %table,
        id = id,
        attempt = attempt,
        otel.name = %format_args!("process {table}"),
        otel.kind = "consumer",
        messaging.system = "sqlbroker",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %table,
        messaging.message.id = %id,
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(creation) = traceparent.and_then(otel::span_context) {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        if tracing::Span::current().is_none() {
            use opentelemetry::trace::TraceContextExt;
            let parent = opentelemetry::Context::new().with_remote_span_context(creation.clone());
            // Refused only without the layer or once started: nothing to continue then.
            let _ = span.set_parent(parent);
        }
        span.add_link(creation);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = traceparent;
    span
}

/// The trace context of the current span, as a `traceparent`: what a publish writes to a row
/// of a table with [`Table::traceparent`](crate::Table::traceparent) when the message gave
/// none. `None` without a valid span context (no span, or no OpenTelemetry layer).
#[cfg(feature = "opentelemetry")]
pub(crate) fn current_traceparent() -> Option<String> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| {
        crate::model::trace::format(
            u128::from_be_bytes(sc.trace_id().to_bytes()),
            u64::from_be_bytes(sc.span_id().to_bytes()),
            sc.trace_flags().to_u8(),
        )
    })
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    /// The remote span context `traceparent` names, if it reads (a row's value was checked at
    /// publish; one written by hand may not be).
    pub(super) fn span_context(traceparent: &str) -> Option<SpanContext> {
        let tp = crate::model::trace::parse(traceparent).ok()?;
        Some(SpanContext::new(
            TraceId::from(tp.trace_id),
            SpanId::from(tp.span_id),
            TraceFlags::new(tp.flags),
            true,
            TraceState::default(),
        ))
    }
}
