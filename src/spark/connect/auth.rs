//! Spark's pre-shared bearer token (connect §4; Spark's
//! `PreSharedKeyAuthenticationInterceptor`, `spark.connect.authenticate.token`).

use std::sync::Arc;

use subtle::ConstantTimeEq;

/// The message of a request without an `authorization` header (connect §4).
pub(crate) const NO_TOKEN: &str = "No authentication token provided";
/// The message of a request whose token does not match (connect §4).
pub(crate) const INVALID_TOKEN: &str = "Invalid authentication token";

/// Whether `token` is one a client can send as `authorization: Bearer <token>` and that
/// protects something (connect §4): not empty, printable ASCII only (what a header carries),
/// without leading or trailing spaces (which headers drop).
///
/// # Errors
/// Why it is not, in words for an operator.
pub fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the token is empty: serve without one to need no authentication".into());
    }
    if let Some(c) = token.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "the token holds {c:?}: a client can send only printable ASCII in a header"
        ));
    }
    if token.trim() != token {
        return Err("the token starts or ends with a space, which headers drop".into());
    }
    Ok(())
}

/// Checks every request's `authorization: Bearer <token>` against the configured token, as
/// a tonic interceptor. Without a configured token every request passes.
#[derive(Clone)]
pub(crate) struct TokenCheck {
    expected: Option<Arc<[u8]>>,
}

impl TokenCheck {
    pub(crate) fn new(token: Option<&str>) -> Self {
        Self {
            expected: token.map(|t| Arc::from(format!("Bearer {t}").into_bytes())),
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        // A refusal is logged at WARN with the peer's address: failed logins are what an
        // operator watches for (the token itself is never logged).
        let refuse = |why: &'static str| {
            let peer = request.remote_addr().map(|a| a.to_string());
            tracing::warn!(
                peer = peer.as_deref().unwrap_or("unknown"),
                why,
                "Spark Connect request refused"
            );
            Err(tonic::Status::unauthenticated(why))
        };
        let Some(got) = request.metadata().get("authorization") else {
            return refuse(NO_TOKEN);
        };
        // Constant time in the token's content (Spark compares with plain equality).
        if bool::from(got.as_bytes().ct_eq(expected)) {
            Ok(request)
        } else {
            refuse(INVALID_TOKEN)
        }
    }
}

/// Adds `authorization: Bearer <token>` to every request of a client (connect §4), and the
/// extra headers the client was given (PySpark sends every extra `;key=value` of its
/// connection string as metadata, connect §3).
#[derive(Clone)]
pub(crate) struct TokenSend {
    header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    extra: std::sync::Arc<
        [(
            tonic::metadata::AsciiMetadataKey,
            tonic::metadata::AsciiMetadataValue,
        )],
    >,
}

impl TokenSend {
    /// # Errors
    /// The token contains characters that cannot travel in an HTTP header.
    pub(crate) fn new(
        token: Option<&str>,
    ) -> Result<Self, tonic::metadata::errors::InvalidMetadataValue> {
        let header = token.map(|t| format!("Bearer {t}").parse()).transpose()?;
        Ok(Self {
            header,
            extra: std::sync::Arc::from(Vec::new()),
        })
    }

    /// The same, also sending `name: value` (replacing an extra header of that name).
    pub(crate) fn with_extra(
        &self,
        name: tonic::metadata::AsciiMetadataKey,
        value: tonic::metadata::AsciiMetadataValue,
    ) -> Self {
        let mut extra: Vec<_> = self
            .extra
            .iter()
            .filter(|(n, _)| *n != name)
            .cloned()
            .collect();
        extra.push((name, value));
        Self {
            header: self.header.clone(),
            extra: extra.into(),
        }
    }
}

/// The token stays out of logs: whether there is one, and the extra headers' names.
impl std::fmt::Debug for TokenSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSend")
            .field("token", &self.header.is_some())
            .field(
                "extra",
                &self
                    .extra
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl tonic::service::Interceptor for TokenSend {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let metadata = request.metadata_mut();
        for (name, value) in self.extra.iter() {
            metadata.insert(name.clone(), value.clone());
        }
        if let Some(h) = &self.header {
            metadata.insert("authorization", h.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn with(header: Option<&str>) -> tonic::Request<()> {
        let mut r = tonic::Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn tokens_no_client_could_send_or_that_protect_nothing_are_refused() {
        assert_eq!(check_token("s3cr3t-token"), Ok(()));
        for bad in ["", "line\nbreak", "tab\t", " padded", "tr\u{e9}s"] {
            let e = check_token(bad).expect_err(bad);
            assert!(e.starts_with("the token "), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tokens_are_checked_with_sparks_messages() {
        let mut check = TokenCheck::new(Some("s3cret"));
        assert!(check.call(with(Some("Bearer s3cret"))).is_ok());
        let missing = check.call(with(None)).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert_eq!(missing.message(), NO_TOKEN);
        for wrong in ["Bearer s3cre", "Bearer s3cretx", "s3cret", "Bearer "] {
            let e = check.call(with(Some(wrong))).unwrap_err();
            assert_eq!(
                (e.code(), e.message()),
                (tonic::Code::Unauthenticated, INVALID_TOKEN)
            );
        }
        assert!(TokenCheck::new(None).call(with(None)).is_ok());
    }

    #[test]
    fn the_client_sends_the_bearer_header() {
        let mut send = TokenSend::new(Some("s3cret")).unwrap();
        let r = send.call(tonic::Request::new(())).unwrap();
        let mut check = TokenCheck::new(Some("s3cret"));
        assert!(check.call(r).is_ok());
        assert!(TokenSend::new(Some("bad\nvalue")).is_err());
    }
}
