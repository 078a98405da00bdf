//! Spark Connect errors on the wire: a [`ConnectError`] becomes the gRPC status real Spark
//! sends (connect §2), and a received status becomes the client's [`RpcError`] (rx §1.8).

use std::collections::HashMap;

use tonic_types::{ErrorDetails, StatusExt};

use crate::execution::client::RpcError;
use crate::execution::{Code, ConnectError, SparkError};

/// `ErrorInfo.domain` of every Spark error (connect §2).
pub(crate) const DOMAIN: &str = "org.apache.spark";

/// `ErrorInfo.reason` and `classes` of the errors of this layer: Spark raises them as
/// `SparkSQLException` (connect §2).
const REASON: &str = "org.apache.spark.SparkSQLException";
const CLASSES: &str = r#"["org.apache.spark.SparkSQLException","java.sql.SQLException","java.lang.Exception","java.lang.Throwable","java.lang.Object"]"#;

/// [`CLASSES`] as a list: the `error_type_hierarchy` of the errors of this layer in
/// FetchErrorDetails (connect §8.1).
pub(super) const SQL_EXCEPTION_CLASSES: [&str; 5] = [
    "org.apache.spark.SparkSQLException",
    "java.sql.SQLException",
    "java.lang.Exception",
    "java.lang.Throwable",
    "java.lang.Object",
];

/// The `ErrorInfo.metadata` key of the id a client passes to FetchErrorDetails
/// (connect §8.1).
pub(super) const ERROR_ID: &str = "errorId";

fn code(code: Code) -> tonic::Code {
    tonic::Code::from_i32(code as i32)
}

fn code_back(code: tonic::Code) -> Code {
    use tonic::Code as T;
    match code {
        T::Ok => Code::Ok,
        T::Cancelled => Code::Cancelled,
        T::Unknown => Code::Unknown,
        T::InvalidArgument => Code::InvalidArgument,
        T::DeadlineExceeded => Code::DeadlineExceeded,
        T::NotFound => Code::NotFound,
        T::AlreadyExists => Code::AlreadyExists,
        T::PermissionDenied => Code::PermissionDenied,
        T::ResourceExhausted => Code::ResourceExhausted,
        T::FailedPrecondition => Code::FailedPrecondition,
        T::Aborted => Code::Aborted,
        T::OutOfRange => Code::OutOfRange,
        T::Unimplemented => Code::Unimplemented,
        T::Internal => Code::Internal,
        T::Unavailable => Code::Unavailable,
        T::DataLoss => Code::DataLoss,
        T::Unauthenticated => Code::Unauthenticated,
    }
}

/// The `messageParameters` of `ErrorInfo`, as Spark names them (connect §2).
pub(super) fn message_parameters(error: &ConnectError) -> Vec<(&'static str, String)> {
    use ConnectError as E;
    match error {
        E::InvalidHandleFormat { handle }
        | E::OperationAbandoned { handle }
        | E::OperationAlreadyExists { handle }
        | E::OperationNotFound { handle }
        | E::SessionChanged { handle }
        | E::SessionClosed { handle }
        | E::SessionNotFound { handle } => vec![("handle", handle.clone())],
        E::PositionNotFound { response_id } => vec![("responseId", response_id.clone())],
        E::PositionNotAvailable { response_id, index } => {
            vec![
                ("responseId", response_id.clone()),
                ("index", index.to_string()),
            ]
        }
        _ => vec![],
    }
}

/// The gRPC status of `error`: its code (INTERNAL for Spark's conditions), Spark's message,
/// and a rich-status trailer (`google.rpc.Status` carrying one `ErrorInfo` with `reason`,
/// `domain`, `errorClass`, `sqlState`, `messageParameters` and `classes`), as Spark 4.3.0
/// sends it (connect §2). No `errorId`: [`ConnectService`](super::ConnectService) adds one
/// to the errors of a live session, whose details it can then answer (connect §8.1); an
/// `errorId` nothing can answer for would only cost the client a FetchErrorDetails call.
///
/// An error without a Spark condition (an engine's [`ConnectError::Failed`], …) still gets
/// the trailer, with no details: Spark sends one with every error it raises, and the
/// Python client reads the message from it (without one it shows the raw gRPC call).
///
/// [`ConnectService`](super::ConnectService) answers every error with it; it is public for
/// code that answers Spark Connect RPCs itself (a method of its own, a proxy, a fault
/// injector) and must send errors the same way.
pub fn to_status(error: &ConnectError) -> tonic::Status {
    status_with_error_id(error, None)
}

/// Whether the status of `error` carries an `ErrorInfo` (an engine's [`SparkError`], or an
/// error with a Spark condition, connect §2): only those can carry an `errorId`
/// (connect §8.1).
pub(super) fn carries_error_info(error: &ConnectError) -> bool {
    matches!(error, ConnectError::Spark(_)) || error.condition().is_some()
}

/// [`to_status`] with `error_id` in the `ErrorInfo` metadata as `errorId`, when given and
/// the status carries an `ErrorInfo` (connect §8.1).
pub(super) fn status_with_error_id(error: &ConnectError, error_id: Option<&str>) -> tonic::Status {
    let message = error.message();
    if let ConnectError::Spark(spark) = error {
        return spark_status(spark, message, error_id);
    }
    let Some(condition) = error.condition() else {
        return tonic::Status::with_error_details(code(error.code()), message, ErrorDetails::new());
    };
    let parameters: serde_json::Map<String, serde_json::Value> = message_parameters(error)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v)))
        .collect();
    let mut metadata = HashMap::new();
    metadata.insert("errorClass".to_owned(), condition.to_owned());
    if let Some(state) = error.sql_state() {
        metadata.insert("sqlState".to_owned(), state.to_owned());
    }
    metadata.insert(
        "messageParameters".to_owned(),
        serde_json::Value::Object(parameters).to_string(),
    );
    metadata.insert("classes".to_owned(), CLASSES.to_owned());
    if let Some(id) = error_id {
        metadata.insert(ERROR_ID.to_owned(), id.to_owned());
    }
    let details = ErrorDetails::with_error_info(REASON, DOMAIN, metadata);
    tonic::Status::with_error_details(code(error.code()), message, details)
}

/// The status of an engine's [`SparkError`]: its own condition, SQLSTATE, parameters and
/// Java classes in the `ErrorInfo` (connect §2), the most specific class as the reason.
fn spark_status(error: &SparkError, message: String, error_id: Option<&str>) -> tonic::Status {
    let mut metadata = HashMap::new();
    if let Some(id) = error_id {
        metadata.insert(ERROR_ID.to_owned(), id.to_owned());
    }
    if let Some(condition) = &error.condition {
        metadata.insert("errorClass".to_owned(), condition.clone());
    }
    if let Some(state) = &error.sql_state {
        metadata.insert("sqlState".to_owned(), state.clone());
    }
    let parameters: serde_json::Map<String, serde_json::Value> = error
        .parameters
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    metadata.insert(
        "messageParameters".to_owned(),
        serde_json::Value::Object(parameters).to_string(),
    );
    metadata.insert(
        "classes".to_owned(),
        serde_json::Value::from(error.classes.clone()).to_string(),
    );
    let reason = error
        .classes
        .first()
        .map_or("java.lang.Exception", String::as_str);
    let details = ErrorDetails::with_error_info(reason, DOMAIN, metadata);
    tonic::Status::with_error_details(tonic::Code::Internal, message, details)
}

/// Whether a transport error's chain holds a TLS failure (connect §7.1): a `rustls::Error`,
/// or the `InvalidData` I/O error tokio-rustls makes of one (which keeps only its text):
/// an alert the other side sent (`received fatal alert: …`, e.g. a server refusing the
/// client's certificate) or a certificate this side refused (`invalid peer certificate: …`).
fn is_tls_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    const TLS_TEXTS: [&str; 2] = ["received fatal alert: ", "invalid peer certificate: "];
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
            && let Some(inner) = io.get_ref()
        {
            let text = inner.to_string();
            if inner.is::<rustls::Error>() || TLS_TEXTS.iter().any(|t| text.starts_with(t)) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

/// The client's view of a failed RPC (rx §1.8): the status code and message, the Spark
/// condition from `ErrorInfo.metadata["errorClass"]` when the trailer carries one, and the
/// `RetryInfo.retry_delay` the server asked for.
///
/// A connection lost mid-call is `UNAVAILABLE`, as gRPC's C and Java clients report it
/// (and as Spark's retry policy expects, rx §6.1). tonic reports it with the transport error
/// as the status's source, which a status the server sent never has: as `UNKNOWN` (a broken
/// connection), `INTERNAL` (an h2 error, such as a GOAWAY from a server shutting down) or
/// `CANCELLED` (the stream reset with `CANCEL` as a server drops it). Each of those is the
/// transport's word, not the server's, so the client reattaches instead of failing. A
/// transport error that is a TLS failure (an untrusted server certificate, a client
/// certificate the server refused, a plaintext peer) is `UNAUTHENTICATED` instead: retrying
/// with the same settings fails the same way, so the client reports it at once.
pub(crate) fn to_rpc_error(status: &tonic::Status) -> RpcError {
    let transport_lost = std::error::Error::source(status).is_some()
        && matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
        );
    let refused_tls = std::error::Error::source(status).is_some_and(is_tls_failure);
    let code = if refused_tls {
        // A certificate not trusted, or refused by the server, a protocol the other side does
        // not speak: the same connection settings fail the same way, so not retryable.
        Code::Unauthenticated
    } else if transport_lost {
        Code::Unavailable
    } else {
        code_back(status.code())
    };
    // The transport's own errors name their cause only in their sources (tonic's message is
    // "transport error"): the message carries them, so a failed TLS handshake says why.
    let message = match std::error::Error::source(status) {
        Some(source) => {
            let causes = super::error_chain(source);
            if causes.is_empty() || status.message().contains(&causes) {
                status.message().to_owned()
            } else if status.message().is_empty() || causes.contains(status.message()) {
                causes
            } else {
                format!("{}: {causes}", status.message())
            }
        }
        None => status.message().to_owned(),
    };
    let mut error = RpcError::new(code, message);
    if let Ok(details) = status.check_error_details() {
        if let Some(class) = details
            .error_info()
            .and_then(|info| info.metadata.get("errorClass"))
        {
            error = error.with_condition(class.clone());
        }
        if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
            error = error.with_retry_delay(delay);
        }
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What tonic reports when the transport, not the server, ends a call (h2's reset or
    /// GOAWAY reasons, a broken connection) becomes UNAVAILABLE, which the client retries
    /// (rx §6.1); the same codes sent by a server (no source) keep their code.
    #[test]
    fn transport_errors_are_unavailable_and_server_statuses_keep_their_code() {
        for reason in [
            h2::Reason::CANCEL,
            h2::Reason::NO_ERROR,
            h2::Reason::INTERNAL_ERROR,
        ] {
            let status = tonic::Status::from_error(Box::new(h2::Error::from(reason)));
            assert!(std::error::Error::source(&status).is_some(), "{status:?}");
            let error = to_rpc_error(&status);
            assert_eq!(error.code(), Code::Unavailable, "{reason:?}: {status:?}");
            assert!(crate::execution::client::RetryPolicy::default_can_retry(
                &error
            ));
        }
        for code in [
            tonic::Code::Internal,
            tonic::Code::Cancelled,
            tonic::Code::Unknown,
        ] {
            let error = to_rpc_error(&tonic::Status::new(code, "from the server"));
            assert_eq!(error.code(), code_back(code));
        }
    }

    /// A TLS failure under the transport error (an untrusted certificate, an alert from a
    /// server that refused the client's certificate) is UNAUTHENTICATED, not retried, and
    /// says why once (connect §7.1).
    #[test]
    fn tls_failures_are_unauthenticated_and_not_retried() {
        let failures = [
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA),
        ];
        for tls in failures {
            let text = tls.to_string();
            let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
            let mut status = tonic::Status::unknown("transport error");
            status.set_source(std::sync::Arc::new(io));
            let error = to_rpc_error(&status);
            assert_eq!(error.code(), Code::Unauthenticated, "{error}");
            assert!(!crate::execution::client::RetryPolicy::default_can_retry(
                &error
            ));
            assert_eq!(error.message().matches(&text).count(), 1, "{error}");
        }
        // A broken pipe is not TLS's word: retried.
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        assert_eq!(to_rpc_error(&status).code(), Code::Unavailable);
    }

    #[test]
    fn the_classes_list_is_the_classes_metadata() {
        let listed: Vec<String> = serde_json::from_str(CLASSES).unwrap();
        assert_eq!(listed, SQL_EXCEPTION_CLASSES);
        assert_eq!(listed[0], REASON);
    }

    /// An `errorId` goes into the `ErrorInfo` of both kinds of status; an error without one
    /// carries none (connect §8.1).
    #[test]
    fn an_error_id_travels_in_the_error_info() {
        let id = "00112233-4455-6677-8899-aabbccddeeff";
        let handle: ConnectError = ConnectError::OperationCanceled;
        let spark: ConnectError = SparkError::analysis("X", "x", "42000").into();
        for e in [handle, spark] {
            assert!(carries_error_info(&e));
            let status = status_with_error_id(&e, Some(id));
            let details = status.check_error_details().unwrap();
            assert_eq!(details.error_info().unwrap().metadata[ERROR_ID], id);
            assert_eq!(status.message(), e.message());
        }
        let failed = ConnectError::failed("no condition");
        assert!(!carries_error_info(&failed));
        let status = status_with_error_id(&failed, Some(id));
        assert!(status.check_error_details().unwrap().error_info().is_none());
    }

    #[test]
    fn spark_conditions_travel_as_internal_with_error_info() {
        let e = ConnectError::OperationNotFound {
            handle: "00112233-4455-6677-8899-aabbccddeeff".into(),
        };
        let status = to_status(&e);
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status
                .message()
                .starts_with("[INVALID_HANDLE.OPERATION_NOT_FOUND] ")
        );
        assert!(
            status.message().ends_with(" SQLSTATE: HY000"),
            "{}",
            status.message()
        );
        let details = status.check_error_details().unwrap();
        let info = details.error_info().expect("ErrorInfo");
        assert_eq!(info.reason, REASON);
        assert_eq!(info.domain, DOMAIN);
        assert_eq!(
            info.metadata["errorClass"],
            "INVALID_HANDLE.OPERATION_NOT_FOUND"
        );
        assert_eq!(info.metadata["sqlState"], "HY000");
        let params: serde_json::Value =
            serde_json::from_str(&info.metadata["messageParameters"]).unwrap();
        assert_eq!(params["handle"], "00112233-4455-6677-8899-aabbccddeeff");
        assert!(!info.metadata.contains_key("errorId"));
    }

    #[test]
    fn an_engines_spark_error_carries_its_own_condition_and_classes() {
        let e: ConnectError = SparkError::analysis(
            "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE",
            "The limit like expression \"-1\" is invalid.",
            "42K0E",
        )
        .with_parameter("expr", "\"-1\"")
        .into();
        let status = to_status(&e);
        assert_eq!(status.code(), tonic::Code::Internal);
        assert_eq!(
            status.message(),
            "[INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE] The limit like expression \"-1\" is \
             invalid. SQLSTATE: 42K0E"
        );
        let details = status.check_error_details().unwrap();
        let info = details.error_info().unwrap();
        assert_eq!(info.reason, "org.apache.spark.sql.AnalysisException");
        assert_eq!(
            info.metadata["errorClass"],
            "INVALID_LIMIT_LIKE_EXPRESSION.IS_NEGATIVE"
        );
        assert_eq!(info.metadata["sqlState"], "42K0E");
        let classes: Vec<String> = serde_json::from_str(&info.metadata["classes"]).unwrap();
        assert_eq!(classes, SparkError::ANALYSIS_EXCEPTION);
        let params: serde_json::Value =
            serde_json::from_str(&info.metadata["messageParameters"]).unwrap();
        assert_eq!(params["expr"], "\"-1\"");

        let plain: ConnectError =
            SparkError::illegal_argument("requirement failed: step (0) cannot be 0").into();
        let status = to_status(&plain);
        assert_eq!(status.message(), "requirement failed: step (0) cannot be 0");
        let info = status
            .check_error_details()
            .unwrap()
            .error_info()
            .cloned()
            .unwrap();
        assert_eq!(info.reason, "java.lang.IllegalArgumentException");
        assert!(!info.metadata.contains_key("errorClass"));
    }

    #[test]
    fn a_status_becomes_the_same_condition_for_the_client() {
        let e = ConnectError::PositionNotAvailable {
            response_id: "r".into(),
            index: 7,
        };
        let rpc = to_rpc_error(&to_status(&e));
        assert_eq!(rpc.code(), Code::Internal);
        assert_eq!(
            rpc.condition(),
            Some("INVALID_CURSOR.POSITION_NOT_AVAILABLE")
        );
        let failed = to_status(&ConnectError::failed("[DIVIDE_BY_ZERO] Division by zero."));
        assert_eq!(failed.code(), tonic::Code::Internal);
        assert_eq!(failed.message(), "[DIVIDE_BY_ZERO] Division by zero.");
        assert!(!failed.details().is_empty(), "the rich-status trailer");
        assert!(failed.check_error_details().unwrap().error_info().is_none());
        let plain = to_rpc_error(&tonic::Status::unavailable("connection reset"));
        assert_eq!(plain.code(), Code::Unavailable);
        assert_eq!(plain.condition(), None);
    }
}
