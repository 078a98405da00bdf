//! FetchErrorDetails (connect §8): the error chain of an error a client was sent with an
//! `errorId`, from the session's store ([`ExecutionManager::record_error`],
//! [`ExecutionManager::take_error`]).

use std::collections::BTreeMap;

use super::status::{SQL_EXCEPTION_CLASSES, message_parameters};
use crate::execution::{ConnectError, ExecutionManager, SparkError};
use crate::wire::connect::fetch_error_details_response::{Error, SparkThrowable};
use crate::wire::connect::{FetchErrorDetailsRequest, FetchErrorDetailsResponse};

/// Most errors of one chain in a response: the root and four causes (Spark's
/// `ErrorUtils.MAX_ERROR_CHAIN_LENGTH`, connect §8.1).
pub(crate) const MAX_ERROR_CHAIN_LENGTH: usize = 5;

/// The session conf that turns `errorId`s off for a session when `false`
/// (`spark.sql.connect.enrichError.enabled`, default true; connect §8.1).
pub(crate) const ENRICH_ERROR_ENABLED: &str = "spark.sql.connect.enrichError.enabled";

/// Answers a FetchErrorDetails: the session is got or created (connect §3), the error is
/// taken from its store (each is answered once) and described; an id the session does not
/// hold is answered with the empty response, no `root_error_idx`, as Spark 4.3.0 answers
/// it (connect §8.1).
///
/// # Errors
/// The session's: `INVALID_HANDLE.FORMAT`, `SESSION_CLOSED`, `SESSION_CHANGED`,
/// `SERVER_DRAINING` (rx §5.6, connect §3).
pub(crate) fn fetch(
    manager: &ExecutionManager,
    request: &FetchErrorDetailsRequest,
) -> Result<FetchErrorDetailsResponse, ConnectError> {
    let (_server_side, error) = manager.take_error(request)?;
    tracing::debug!(found = error.is_some(), "FetchErrorDetails");
    Ok(error.map_or_else(FetchErrorDetailsResponse::default, |e| details(&e)))
}

/// The FetchErrorDetails answer for `error` (connect §8.1): `root_error_idx` 0 and the
/// chain, root first, each error naming the next as its cause, at most
/// [`MAX_ERROR_CHAIN_LENGTH`]. Each error has its Java classes (`error_type_hierarchy`,
/// the `classes` of its status), its whole message, and, when it has a condition, its
/// condition, message parameters and SQLSTATE. No stack trace (tether has no JVM stack)
/// and no query contexts; `session_id` and `server_side_session_id` unset, as Spark 4.3.0
/// sends them.
pub(crate) fn details(error: &ConnectError) -> FetchErrorDetailsResponse {
    let errors = match error {
        ConnectError::Spark(spark) => chain(spark),
        other => vec![Error {
            error_type_hierarchy: match other.condition() {
                Some(_) => SQL_EXCEPTION_CLASSES.map(str::to_owned).to_vec(),
                None => Vec::new(),
            },
            message: other.message(),
            spark_throwable: other.condition().map(|condition| SparkThrowable {
                error_class: Some(condition.to_owned()),
                message_parameters: message_parameters(other)
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                sql_state: other.sql_state().map(str::to_owned),
                ..SparkThrowable::default()
            }),
            ..Error::default()
        }],
    };
    FetchErrorDetailsResponse {
        root_error_idx: Some(0),
        errors,
        ..FetchErrorDetailsResponse::default()
    }
}

/// An engine's error and its causes, as Spark's `ErrorUtils.throwableToProtoErrors` lists a
/// throwable's chain (connect §8.1): a cause index on every error whose cause is listed.
fn chain(root: &SparkError) -> Vec<Error> {
    let mut errors = Vec::new();
    let mut next = Some(root);
    while let Some(error) = next
        && errors.len() < MAX_ERROR_CHAIN_LENGTH
    {
        let cause_idx = errors.len() + 1;
        next = error.cause.as_deref();
        errors.push(Error {
            error_type_hierarchy: error.classes.clone(),
            message: error.message(),
            cause_idx: (next.is_some() && cause_idx < MAX_ERROR_CHAIN_LENGTH)
                .then(|| i32::try_from(cause_idx).unwrap_or(i32::MAX)),
            spark_throwable: error.condition.as_ref().map(|condition| SparkThrowable {
                error_class: Some(condition.clone()),
                message_parameters: error
                    .parameters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>(),
                sql_state: error.sql_state.clone(),
                ..SparkThrowable::default()
            }),
            ..Error::default()
        });
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arithmetic(text: &str) -> SparkError {
        let mut e = SparkError::analysis("DIVIDE_BY_ZERO", text, "22012")
            .with_parameter("config", "\"spark.sql.ansi.enabled\"");
        e.classes = [
            "org.apache.spark.SparkArithmeticException",
            "java.lang.ArithmeticException",
            "java.lang.RuntimeException",
            "java.lang.Exception",
            "java.lang.Throwable",
            "java.lang.Object",
        ]
        .map(str::to_owned)
        .to_vec();
        e
    }

    /// An engine's error: condition, parameters, SQLSTATE, classes and whole message, as
    /// Spark 4.3.0 answers `SELECT 1/0` (measured, connect §8.1).
    #[test]
    fn an_engine_error_is_its_condition_parameters_and_state() {
        let e = arithmetic("Division by zero.");
        let r = details(&ConnectError::from(e.clone()));
        assert_eq!(r.root_error_idx, Some(0));
        assert_eq!(r.errors.len(), 1);
        let root = &r.errors[0];
        assert_eq!(root.error_type_hierarchy, e.classes);
        assert_eq!(
            root.message,
            "[DIVIDE_BY_ZERO] Division by zero. SQLSTATE: 22012"
        );
        assert_eq!(root.cause_idx, None);
        assert!(root.stack_trace.is_empty());
        let t = root.spark_throwable.as_ref().unwrap();
        assert_eq!(t.error_class.as_deref(), Some("DIVIDE_BY_ZERO"));
        assert_eq!(t.sql_state.as_deref(), Some("22012"));
        assert_eq!(t.message_parameters["config"], "\"spark.sql.ansi.enabled\"");
        assert!(r.session_id.is_empty() && r.server_side_session_id.is_empty());
    }

    /// Causes are listed after their error, each linked by index; the chain ends after
    /// five errors, the fifth without a cause index (Spark's `MAX_ERROR_CHAIN_LENGTH`). A
    /// cause without a condition (a plain Java exception) has no `spark_throwable`.
    #[test]
    fn causes_are_linked_and_the_chain_ends_at_five() {
        let plain = SparkError::illegal_argument("deepest");
        let mut e = plain.clone();
        for n in 0..6 {
            e = arithmetic(&format!("level {n}")).with_cause(e);
        }
        let r = details(&ConnectError::from(e));
        assert_eq!(r.errors.len(), MAX_ERROR_CHAIN_LENGTH);
        for (i, error) in r.errors.iter().enumerate() {
            let want = (i + 1 < MAX_ERROR_CHAIN_LENGTH).then(|| i as i32 + 1);
            assert_eq!(error.cause_idx, want, "error {i}");
        }
        assert!(r.errors[0].message.contains("level 5"));
        let two = details(&ConnectError::from(arithmetic("top").with_cause(plain)));
        assert_eq!(two.errors.len(), 2);
        assert_eq!(two.errors[0].cause_idx, Some(1));
        assert_eq!(two.errors[1].spark_throwable, None);
        assert_eq!(two.errors[1].message, "deepest");
        assert_eq!(
            two.errors[1].error_type_hierarchy,
            SparkError::ILLEGAL_ARGUMENT_EXCEPTION
        );
    }

    /// tether's own conditions are `SparkSQLException`s, as Spark raises them (connect §2).
    #[test]
    fn a_protocol_error_is_a_spark_sql_exception() {
        let e = ConnectError::OperationNotFound {
            handle: "00112233-4455-6677-8899-aabbccddeeff".into(),
        };
        let r = details(&e);
        let root = &r.errors[0];
        assert_eq!(root.error_type_hierarchy, SQL_EXCEPTION_CLASSES);
        assert_eq!(root.message, e.message());
        let t = root.spark_throwable.as_ref().unwrap();
        assert_eq!(
            t.error_class.as_deref(),
            Some("INVALID_HANDLE.OPERATION_NOT_FOUND")
        );
        assert_eq!(t.sql_state.as_deref(), Some("HY000"));
        assert_eq!(
            t.message_parameters["handle"],
            "00112233-4455-6677-8899-aabbccddeeff"
        );
    }
}
