//! The W3C trace context a row may carry ([`Table::traceparent`](crate::Table::traceparent)):
//! the check of a `traceparent` value and its parts. No I/O, no tracing crate.

/// The length of a `traceparent` of version `00`: `00-<32 hex>-<16 hex>-<2 hex>`.
pub(crate) const TRACEPARENT_LEN: usize = 55;

/// The parts of a valid `traceparent`: the trace id, the parent span id and the flags.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) struct TraceParent {
    pub trace_id: u128,
    pub span_id: u64,
    pub flags: u8,
}

/// Reads `value` as a W3C `traceparent` of version `00`
/// (<https://www.w3.org/TR/trace-context/#traceparent-header>): lowercase hex fields of 2, 32,
/// 16 and 2 digits joined by `-`, neither id all zeros. Why not, in words, otherwise.
pub(crate) fn parse(value: &str) -> Result<TraceParent, String> {
    let bad = |why: &str| {
        Err(format!(
            "traceparent {:?}: {why} (expected 00-<32 hex>-<16 hex>-<2 hex>, lowercase)",
            // Bounded, so a long wrong value does not fill the error.
            value.chars().take(64).collect::<String>()
        ))
    };
    if value.len() != TRACEPARENT_LEN {
        return bad(&format!("{} bytes, not {TRACEPARENT_LEN}", value.len()));
    }
    let parts: Vec<&str> = value.split('-').collect();
    let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
    if lens != [2, 32, 16, 2] {
        return bad("not four fields of 2, 32, 16 and 2 digits");
    }
    if !parts.iter().all(|p| {
        p.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }) {
        return bad("not lowercase hex");
    }
    if parts[0] != "00" {
        return bad("not version 00");
    }
    let hex = |p: &str| u128::from_str_radix(p, 16).unwrap_or(0);
    let (trace_id, span_id, flags) = (hex(parts[1]), hex(parts[2]), hex(parts[3]));
    if trace_id == 0 {
        return bad("the trace id is all zeros");
    }
    if span_id == 0 {
        return bad("the parent id is all zeros");
    }
    Ok(TraceParent {
        trace_id,
        span_id: span_id as u64,
        flags: flags as u8,
    })
}

/// The `traceparent` of version `00` of these parts.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) fn format(trace_id: u128, span_id: u64, flags: u8) -> String {
    format!("00-{trace_id:032x}-{span_id:016x}-{flags:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The W3C example reads and writes back; every malformed value is refused, naming why.
    /// Fails (`accepted`) without the all-zero checks.
    #[test]
    fn traceparent_values_are_checked() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = parse(good).unwrap();
        assert_eq!(tp.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!((tp.span_id, tp.flags), (0x00f067aa0ba902b7, 1));
        assert_eq!(format(tp.trace_id, tp.span_id, tp.flags), good);
        for (bad, why) in [
            ("", "0 bytes"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
                "54 bytes",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                "lowercase",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e47-3600f067aa0ba902b7-01",
                "four fields",
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
                "four fields",
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version 00",
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
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                "hex",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b\u{e9}-1",
                "four fields",
            ),
        ] {
            match parse(bad) {
                Err(e) => assert!(e.contains(why), "{bad:?}: {e}"),
                Ok(_) => panic!("{bad:?} accepted"),
            }
        }
    }
}
