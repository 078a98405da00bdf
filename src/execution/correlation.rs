//! The ids a request carries besides its body, so that one request can be followed across a
//! gateway, the server and its logs (connect §13): the `spark-connect-operation-id` header
//! of Spark master's clients (SPARK-58632), W3C `traceparent` and the `x-request-id` of
//! gateways, as the RPC's span and the `OperationStarted` event report them.

use std::sync::Arc;

/// The header Spark master's clients send the operation id in (SPARK-58632).
pub const OPERATION_ID_HEADER: &str = "spark-connect-operation-id";

/// Longest header value kept, in bytes (connect §13): a `traceparent` is 55; request ids are UUIDs or
/// shorter. A longer value is dropped, not cut.
pub const MAX_CORRELATION_LEN: usize = 256;

/// A request's correlation ids (connect §13): each as sent, when it is printable ASCII of at
/// most [`MAX_CORRELATION_LEN`] bytes; else absent (a client's header never fails its
/// request).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Correlation {
    /// `spark-connect-operation-id`, the operation id Spark master's clients also send as a
    /// header on ExecutePlan, ReattachExecute and ReleaseExecute (SPARK-58632). Reported
    /// only: the body's `operation_id` is the one that counts, as in Spark 4.3.0, which
    /// ignores the header.
    pub operation_id: Option<Arc<str>>,
    /// `x-request-id`, as gateways and proxies set it.
    pub request_id: Option<Arc<str>>,
    /// W3C Trace Context `traceparent` (`version-traceid-parentid-flags`), kept as sent.
    pub traceparent: Option<Arc<str>>,
}

impl Correlation {
    /// The ids of a request whose headers `header` reads by (lower-case) name (connect §13).
    pub fn from_headers<'a>(header: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        Self {
            operation_id: header(OPERATION_ID_HEADER).and_then(kept),
            request_id: header("x-request-id").and_then(kept),
            traceparent: header("traceparent").and_then(kept),
        }
    }

    /// Whether it carries no id (connect §13).
    pub fn is_empty(&self) -> bool {
        self.operation_id.is_none() && self.request_id.is_none() && self.traceparent.is_none()
    }

    /// The operation-id header when it names another operation than `body` (the request's
    /// `operation_id`, `""` when it has none), compared as UUIDs when both are (rx §1.9):
    /// what the server logs, with both ids.
    pub fn operation_id_mismatch(&self, body: &str) -> Option<&str> {
        let header = self.operation_id.as_deref()?;
        let same = match (
            super::keys::parse_uuid(header),
            super::keys::parse_uuid(body),
        ) {
            (Some(h), Some(b)) => h == b,
            _ => header == body,
        };
        (!same).then_some(header)
    }
}

/// `value` when it may go into a log line and a span as it is.
pub(crate) fn kept(value: &[u8]) -> Option<Arc<str>> {
    let printable = |b: &u8| (0x20..0x7f).contains(b);
    if value.is_empty() || value.len() > MAX_CORRELATION_LEN || !value.iter().all(printable) {
        return None;
    }
    std::str::from_utf8(value).ok().map(Arc::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_values_are_kept_and_others_dropped() {
        let headers = |name: &str| -> Option<&'static [u8]> {
            match name {
                "x-request-id" => Some(b"req-42"),
                "traceparent" => Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
                _ => None,
            }
        };
        let c = Correlation::from_headers(headers);
        assert_eq!(c.request_id.as_deref(), Some("req-42"));
        assert_eq!(
            c.traceparent.as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        for bad in [&b""[..], b"a\nb", b"\xff", &[b'x'; MAX_CORRELATION_LEN + 1]] {
            assert_eq!(kept(bad), None, "{bad:?}");
        }
        assert!(Correlation::from_headers(|_| None).is_empty());
        let op = "0be7a7e0-0000-4000-8000-0000000ab0de";
        let with = |v: &'static [u8]| {
            Correlation::from_headers(move |n| (n == OPERATION_ID_HEADER).then_some(v))
        };
        assert_eq!(with(op.as_bytes()).operation_id_mismatch(op), None);
        let upper = op.to_uppercase();
        assert_eq!(with(op.as_bytes()).operation_id_mismatch(&upper), None);
        assert_eq!(with(b"other").operation_id_mismatch(op), Some("other"));
        assert_eq!(with(op.as_bytes()).operation_id_mismatch(""), Some(op));
        assert_eq!(Correlation::default().operation_id_mismatch(op), None);
    }
}
