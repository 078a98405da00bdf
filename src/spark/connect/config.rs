//! The `Config` RPC over one session's configuration, as Spark 4.3.0's
//! `SparkConnectConfigHandler` answers it (connect §3, §12): `GetAll` strips the prefix,
//! entries whose key or value matches the default `spark.redaction.regex` read as absent,
//! and the server's token is never answered and cannot be set (measured on Spark 4.3.0 with
//! raw gRPC; docs/reference/spark-connect.md §12).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::execution::{ConnectError, SparkError};
use crate::wire::connect::{KeyValue, config_request};

/// The key of the server's token (Spark's static `spark.connect.authenticate.token`,
/// connect §4): a Set or Unset of it is `CANNOT_MODIFY_STATIC_CONFIG`, as in Spark 4.3.0.
const TOKEN_KEY: &str = "spark.connect.authenticate.token";

/// What Spark 4.3.0's default `spark.redaction.regex`,
/// `(?i)secret|password|token|access[.]?key|credential` (`SECRET_REDACTION_PATTERN` in
/// `org.apache.spark.internal.config`, read from the 4.3.0 jar), finds anywhere in `text`:
/// Java's `(?i)` folds ASCII letters only, as `to_ascii_lowercase` does.
fn matches_redaction_regex(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "secret",
        "password",
        "token",
        "accesskey",
        "access.key",
        "credential",
    ]
    .iter()
    .any(|word| text.contains(word))
}

/// The tokens of the gRPC services made of one `ConnectService` (each
/// `ConnectService::into_service` adds its `ConnectConfig::token`): a Config answer never
/// carries a value that contains one of them.
#[derive(Debug, Default)]
pub(crate) struct ServerTokens(Mutex<Vec<String>>);

impl ServerTokens {
    /// Adds `token` (an empty one is ignored: every value would contain it, and
    /// `check_token` refuses it anyway).
    pub(crate) fn add(&self, token: &str) {
        let mut tokens = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !token.is_empty() && !tokens.iter().any(|t| t == token) {
            tokens.push(token.to_owned());
        }
    }

    /// A copy of the tokens, for one Config request.
    pub(crate) fn hider(&self) -> Hider {
        Hider(
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// Decides which entries a Config answer treats as absent (connect §12).
pub(crate) struct Hider(Vec<String>);

impl Hider {
    /// Whether the entry `key` = `value` is hidden: Spark 4.3.0's `isRedacted` (the
    /// redaction regex finds something in the key or in the value), or the value contains
    /// the server's token (tether's own rule: Spark answers a client's value whatever it
    /// holds).
    fn hides(&self, key: &str, value: Option<&str>) -> bool {
        matches_redaction_regex(key)
            || value.is_some_and(|v| matches_redaction_regex(v) || self.carries_token(v))
    }

    /// Whether `value` contains one of the server's tokens.
    fn carries_token(&self, value: &str) -> bool {
        self.0.iter().any(|t| value.contains(t.as_str()))
    }
}

/// A Config operation applied to the session's configuration, whose answer still needs the
/// engine's defaults (looked up outside the configuration's lock).
pub(crate) struct Pending {
    pairs: Vec<Entry>,
    /// Get: a key without a visible value fails the request (`SQL_CONF_NOT_FOUND`).
    strict: bool,
    hider: Hider,
}

enum Entry {
    /// Get or GetOption of `key`: the session's value, if any (else the engine's default).
    Read { key: String, value: Option<String> },
    /// GetWithDefault: the session's value, else the client's `default`.
    WithDefault {
        key: String,
        value: Option<String>,
        default: Option<String>,
    },
    /// An answer that is final (GetAll's visible entries, IsModifiable).
    Done(KeyValue),
}

/// `CANNOT_MODIFY_STATIC_CONFIG` (SQLSTATE 46110, an `AnalysisException`) for `key`, with
/// Spark 4.3.0's text and parameter (measured for `spark.connect.authenticate.token`).
fn cannot_modify_static_config(key: &str) -> ConnectError {
    let mut error = SparkError {
        condition: Some("CANNOT_MODIFY_STATIC_CONFIG".to_owned()),
        text: format!("Cannot modify the value of the static Spark config: \"{key}\"."),
        sql_state: Some("46110".to_owned()),
        parameters: BTreeMap::new(),
        classes: SparkError::ANALYSIS_EXCEPTION
            .iter()
            .map(|c| (*c).to_owned())
            .collect(),
        cause: None,
    };
    error
        .parameters
        .insert("key".to_owned(), format!("\"{key}\""));
    error.into()
}

/// Spark 4.3.0's `IllegalArgumentException` (no condition) for a Set pair without a value:
/// `requirement failed: value cannot be null for key: KEY` (measured).
fn null_value(key: &str) -> ConnectError {
    SparkError {
        condition: None,
        text: format!("requirement failed: value cannot be null for key: {key}"),
        sql_state: None,
        parameters: BTreeMap::new(),
        classes: SparkError::ILLEGAL_ARGUMENT_EXCEPTION
            .iter()
            .map(|c| (*c).to_owned())
            .collect(),
        cause: None,
    }
    .into()
}

/// Applies `operation` to `conf` (one session's configuration, under its lock), in the order
/// of its keys as Spark does: a Set or Unset that fails at one key keeps what it did for the
/// keys before it.
///
/// Errors: `CANNOT_MODIFY_STATIC_CONFIG` for a Set or Unset of
/// `spark.connect.authenticate.token`; an `IllegalArgumentException` for a Set pair without
/// a value.
pub(crate) fn apply(
    conf: &mut BTreeMap<String, String>,
    operation: Option<config_request::operation::OpType>,
    hider: Hider,
) -> Result<Pending, ConnectError> {
    use config_request::operation::OpType;
    let mut pending = Pending {
        pairs: Vec::new(),
        strict: false,
        hider,
    };
    let read = |conf: &BTreeMap<String, String>, keys: Vec<String>| -> Vec<Entry> {
        keys.into_iter()
            .map(|key| Entry::Read {
                value: conf.get(&key).cloned(),
                key,
            })
            .collect()
    };
    match operation {
        Some(OpType::Set(set)) => {
            for kv in set.pairs {
                if kv.key == TOKEN_KEY {
                    return Err(cannot_modify_static_config(&kv.key));
                }
                let Some(value) = kv.value else {
                    return Err(null_value(&kv.key));
                };
                conf.insert(kv.key, value);
            }
        }
        Some(OpType::Unset(unset)) => {
            for key in unset.keys {
                if key == TOKEN_KEY {
                    return Err(cannot_modify_static_config(&key));
                }
                conf.remove(&key);
            }
        }
        Some(OpType::Get(config_request::Get { keys })) => {
            pending.strict = true;
            pending.pairs = read(conf, keys);
        }
        Some(OpType::GetOption(config_request::GetOption { keys })) => {
            pending.pairs = read(conf, keys);
        }
        Some(OpType::GetWithDefault(g)) => {
            pending.pairs = g
                .pairs
                .into_iter()
                .map(|kv| Entry::WithDefault {
                    value: conf.get(&kv.key).cloned(),
                    key: kv.key,
                    default: kv.value,
                })
                .collect();
        }
        Some(OpType::GetAll(g)) => {
            // Spark: the visible entries whose key starts with the prefix, the prefix
            // stripped (an empty or absent prefix: every visible entry, whole).
            let prefix = g.prefix.unwrap_or_default();
            let hider = &pending.hider;
            pending.pairs = conf
                .iter()
                .filter(|(k, v)| k.starts_with(&prefix) && !hider.hides(k, Some(v)))
                .map(|(k, v)| Entry::Done(KeyValue::new(&k[prefix.len()..], v.clone())))
                .collect();
        }
        Some(OpType::IsModifiable(m)) => {
            pending.pairs = m
                .keys
                .into_iter()
                .map(|k| {
                    let modifiable = if k == TOKEN_KEY { "false" } else { "true" };
                    Entry::Done(KeyValue::new(k, modifiable))
                })
                .collect();
        }
        None => {}
    }
    Ok(pending)
}

impl Pending {
    /// The answer's pairs, in the request's order: a Get or GetOption of a key the session
    /// has not set reads `default` (the engine's default); a hidden entry reads as absent
    /// (GetOption: no value; GetWithDefault: the client's default; Get: an error).
    ///
    /// Errors: `SQL_CONF_NOT_FOUND` for the first key of a Get without a visible value.
    pub(crate) fn answer(
        self,
        default: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<KeyValue>, ConnectError> {
        let hider = self.hider;
        let mut pairs = Vec::with_capacity(self.pairs.len());
        for entry in self.pairs {
            pairs.push(match entry {
                Entry::Read { key, value } => {
                    let value = value
                        .or_else(|| default(&key))
                        .filter(|v| !hider.hides(&key, Some(v)));
                    if self.strict && value.is_none() {
                        return Err(SparkError::sql_conf_not_found(&key).into());
                    }
                    KeyValue { key, value }
                }
                Entry::WithDefault {
                    key,
                    value,
                    default,
                } => {
                    let value = match value {
                        Some(v) if !hider.hides(&key, Some(&v)) => Some(v),
                        // Spark answers the client's default as sent.
                        _ => default.filter(|d| !hider.carries_token(d)),
                    };
                    KeyValue { key, value }
                }
                Entry::Done(kv) => kv,
            });
        }
        Ok(pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_request::operation::OpType;

    fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn hider(tokens: &[&str]) -> Hider {
        let t = ServerTokens::default();
        for token in tokens {
            t.add(token);
        }
        t.hider()
    }

    fn run(
        conf: &mut BTreeMap<String, String>,
        op: OpType,
        tokens: &[&str],
    ) -> Result<Vec<KeyValue>, ConnectError> {
        apply(conf, Some(op), hider(tokens))?
            .answer(|k| (k == "spark.sql.session.timeZone").then(|| "Etc/UTC".to_owned()))
    }

    fn condition(e: &ConnectError) -> Option<String> {
        match e {
            ConnectError::Spark(s) => s.condition.clone(),
            _ => None,
        }
    }

    #[test]
    fn the_redaction_regex_is_sparks_default() {
        for hidden in [
            "spark.my.password",
            "spark.my.Token",
            "spark.my.accesskey",
            "spark.my.ACCESS.KEY",
            "spark.mysecretthing",
            "spark.v.credentials",
        ] {
            assert!(matches_redaction_regex(hidden), "{hidden}");
        }
        for shown in [
            "spark.my.plain",
            "spark.access_key",
            "spark.tok.en",
            "pass word",
        ] {
            assert!(!matches_redaction_regex(shown), "{shown}");
        }
    }

    #[test]
    fn get_all_strips_the_prefix_and_leaves_hidden_entries_out() {
        let mut c = conf(&[
            ("spark.my.plain", "v"),
            ("spark.my.password", "p"),
            ("spark.my.other", "a Secret value"),
            ("spark.my.tok", "xx-s3rv3r-xx"),
            ("spark.sql.x", "1"),
        ]);
        let all = |prefix: Option<&str>, c: &mut BTreeMap<String, String>| {
            run(
                c,
                OpType::GetAll(config_request::GetAll {
                    prefix: prefix.map(str::to_owned),
                }),
                &["s3rv3r"],
            )
            .unwrap()
        };
        assert_eq!(
            all(Some("spark.my."), &mut c),
            vec![KeyValue::new("plain", "v")]
        );
        assert_eq!(
            all(Some("spark.my"), &mut c),
            vec![KeyValue::new(".plain", "v")]
        );
        assert_eq!(
            all(Some("spark.my.plain"), &mut c),
            vec![KeyValue::new("", "v")]
        );
        assert_eq!(all(Some("nomatch"), &mut c), vec![]);
        assert_eq!(
            all(None, &mut c),
            vec![
                KeyValue::new("spark.my.plain", "v"),
                KeyValue::new("spark.sql.x", "1")
            ]
        );
        assert_eq!(all(Some(""), &mut c), all(None, &mut c));
    }

    #[test]
    fn a_hidden_entry_reads_as_absent_in_every_get() {
        let mut c = conf(&[("spark.my.password", "p"), ("spark.my.plain", "v")]);
        let e = run(
            &mut c,
            OpType::Get(config_request::Get {
                keys: vec!["spark.my.plain".into(), "spark.my.password".into()],
            }),
            &[],
        )
        .unwrap_err();
        assert_eq!(condition(&e).as_deref(), Some("SQL_CONF_NOT_FOUND"));
        assert!(e.to_string().contains("\"spark.my.password\""), "{e}");
        let got = run(
            &mut c,
            OpType::GetOption(config_request::GetOption {
                keys: vec!["spark.my.password".into(), "spark.my.plain".into()],
            }),
            &[],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                KeyValue {
                    key: "spark.my.password".into(),
                    value: None
                },
                KeyValue::new("spark.my.plain", "v")
            ]
        );
        let got = run(
            &mut c,
            OpType::GetWithDefault(config_request::GetWithDefault {
                pairs: vec![
                    KeyValue::new("spark.my.password", "d"),
                    KeyValue {
                        key: "spark.my.password".into(),
                        value: None,
                    },
                    KeyValue::new("spark.my.plain", "z"),
                ],
            }),
            &[],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                KeyValue::new("spark.my.password", "d"),
                KeyValue {
                    key: "spark.my.password".into(),
                    value: None
                },
                KeyValue::new("spark.my.plain", "v")
            ]
        );
    }

    #[test]
    fn the_servers_token_is_never_answered_nor_set() {
        let token = "s3rv3r-t0k";
        let mut c = conf(&[("spark.x.y", token), ("spark.x.z", "a s3rv3r-t0k b")]);
        let got = run(
            &mut c,
            OpType::GetOption(config_request::GetOption {
                keys: vec![TOKEN_KEY.into(), "spark.x.y".into(), "spark.x.z".into()],
            }),
            &[token],
        )
        .unwrap();
        assert!(got.iter().all(|kv| kv.value.is_none()), "{got:?}");
        let got = run(
            &mut c,
            OpType::GetWithDefault(config_request::GetWithDefault {
                pairs: vec![KeyValue::new("spark.x.y", "d"), KeyValue::new("k", token)],
            }),
            &[token],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                KeyValue::new("spark.x.y", "d"),
                KeyValue {
                    key: "k".into(),
                    value: None
                }
            ]
        );
        let e = run(
            &mut c,
            OpType::Set(config_request::Set {
                pairs: vec![
                    KeyValue::new("spark.a", "1"),
                    KeyValue::new(TOKEN_KEY, token),
                    KeyValue::new("spark.b", "2"),
                ],
                silent: None,
            }),
            &[token],
        )
        .unwrap_err();
        assert_eq!(
            condition(&e).as_deref(),
            Some("CANNOT_MODIFY_STATIC_CONFIG")
        );
        assert_eq!(
            e.to_string(),
            "[CANNOT_MODIFY_STATIC_CONFIG] Cannot modify the value of the static Spark config: \
             \"spark.connect.authenticate.token\". SQLSTATE: 46110"
        );
        // Spark keeps the pairs before the failing one.
        assert_eq!(c.get("spark.a").map(String::as_str), Some("1"));
        assert!(!c.contains_key("spark.b") && !c.contains_key(TOKEN_KEY));
        let e = run(
            &mut c,
            OpType::Unset(config_request::Unset {
                keys: vec!["spark.a".into(), TOKEN_KEY.into()],
            }),
            &[token],
        )
        .unwrap_err();
        assert_eq!(
            condition(&e).as_deref(),
            Some("CANNOT_MODIFY_STATIC_CONFIG")
        );
        assert!(!c.contains_key("spark.a"));
        let got = run(
            &mut c,
            OpType::IsModifiable(config_request::IsModifiable {
                keys: vec![TOKEN_KEY.into(), "spark.sql.ansi.enabled".into()],
            }),
            &[token],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                KeyValue::new(TOKEN_KEY, "false"),
                KeyValue::new("spark.sql.ansi.enabled", "true")
            ]
        );
    }

    #[test]
    fn a_set_pair_without_a_value_fails_as_in_spark() {
        let mut c = conf(&[]);
        let e = run(
            &mut c,
            OpType::Set(config_request::Set {
                pairs: vec![
                    KeyValue::new("spark.a", "1"),
                    KeyValue {
                        key: "spark.d".into(),
                        value: None,
                    },
                ],
                silent: None,
            }),
            &[],
        )
        .unwrap_err();
        assert_eq!(condition(&e), None);
        assert!(
            e.to_string()
                .contains("requirement failed: value cannot be null for key: spark.d"),
            "{e}"
        );
        assert_eq!(c.get("spark.a").map(String::as_str), Some("1"));
    }

    #[test]
    fn a_get_falls_back_to_the_engines_default() {
        let mut c = conf(&[]);
        let got = run(
            &mut c,
            OpType::Get(config_request::Get {
                keys: vec!["spark.sql.session.timeZone".into()],
            }),
            &[],
        )
        .unwrap();
        assert_eq!(
            got,
            vec![KeyValue::new("spark.sql.session.timeZone", "Etc/UTC")]
        );
    }
}
