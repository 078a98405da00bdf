//! CloneSession and GetStatus (connect §14, §15): the service's part of them. The registry
//! decides both ([`ExecutionManager::clone_session`], [`ExecutionManager::get_status`]);
//! CloneSession then copies the session's configuration and, through
//! [`QueryEngine::clone_session`], the engine's state, and removes the new session again if
//! the engine refuses.
//!
//! [`ExecutionManager::clone_session`]: crate::execution::ExecutionManager::clone_session
//! [`ExecutionManager::get_status`]: crate::execution::ExecutionManager::get_status

use std::collections::BTreeMap;
use std::sync::PoisonError;

use super::{ConnectService, QueryEngine, session_key};
use crate::execution::{Code, ConnectError};
use crate::wire::connect::{
    CloneSessionRequest, CloneSessionResponse, GetStatusRequest, GetStatusResponse,
};

impl<E: QueryEngine> ConnectService<E> {
    /// CloneSession's handler (connect §14): the manager checks the source and the target
    /// and creates the target; the source's configuration is copied to it, then the
    /// engine's state ([`QueryEngine::clone_session`]). If the engine fails (or panics) the
    /// target's configuration and the target are removed again, so the request leaves
    /// nothing behind, and the engine's error is the answer.
    pub(super) fn clone_session_rpc(
        &self,
        request: &CloneSessionRequest,
    ) -> Result<CloneSessionResponse, ConnectError> {
        let response = self.inner.manager.clone_session(request)?;
        tracing::debug!(
            new_session_id = response.new_session_id.as_str(),
            "CloneSession"
        );
        let user_id = request.user_id();
        let source = self.session_context(
            user_id,
            &request.session_id,
            response.server_side_session_id.clone(),
        );
        let target = self.session_context(
            user_id,
            &response.new_session_id,
            response.new_server_side_session_id.clone(),
        );
        // The manager accepted the target's id, so it is a UUID.
        if let Some(key) = session_key(user_id, &target.session_id) {
            let mut confs = self
                .inner
                .confs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let conf: BTreeMap<String, String> = confs
                .get(&source.server_side_session_id)
                .map(|(_, conf)| conf.clone())
                .unwrap_or_default();
            confs.insert(target.server_side_session_id.clone(), (key, conf));
        }
        let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.inner.engine.clone_session(&source, &target)
        }))
        .unwrap_or_else(|_| {
            tracing::error!("QueryEngine::clone_session panicked");
            Err(ConnectError::Failed {
                message: "[INTERNAL_ERROR] The query engine panicked while cloning the \
                          session. SQLSTATE: XX000"
                    .to_owned(),
                code: Code::Internal,
            })
        });
        if let Err(e) = copied {
            self.inner
                .confs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&target.server_side_session_id);
            self.inner.manager.discard_session(
                user_id,
                &target.session_id,
                &target.server_side_session_id,
            );
            return Err(e);
        }
        Ok(response)
    }

    /// GetStatus's handler (connect §15): the manager's answer; it never creates a session.
    pub(super) fn get_status_rpc(
        &self,
        request: &GetStatusRequest,
    ) -> Result<GetStatusResponse, ConnectError> {
        let response = self.inner.manager.get_status(request)?;
        tracing::debug!(operations = response.operation_statuses.len(), "GetStatus");
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::execution::{ExecutionManager, ManagerConfig, SessionKey};
    use crate::spark::connect::ResponseSource;
    use crate::spark::connect::SessionContext;
    use crate::wire::connect::{
        ConfigRequest, ExecutePlanRequest, KeyValue, UserContext, config_request,
    };

    const SOURCE: &str = "00112233-4455-6677-8899-aabbccddeeff";
    const TARGET: &str = "10112233-4455-6677-8899-aabbccddeeff";

    /// Records the clones it is asked for, and refuses them while `refuse` is set.
    #[derive(Default)]
    struct Engine {
        refuse: bool,
        panic: bool,
        clones: Mutex<Vec<(SessionContext, SessionContext)>>,
    }

    impl QueryEngine for Arc<Engine> {
        fn execute(
            &self,
            _: &SessionContext,
            _: &ExecutePlanRequest,
        ) -> Result<ResponseSource, ConnectError> {
            Err(ConnectError::UnknownReleaseType)
        }

        fn clone_session(
            &self,
            source: &SessionContext,
            target: &SessionContext,
        ) -> Result<(), ConnectError> {
            assert!(!self.panic, "the engine panics");
            self.clones
                .lock()
                .unwrap()
                .push((source.clone(), target.clone()));
            if self.refuse {
                return Err(ConnectError::Failed {
                    message: "[ENGINE] cannot copy".into(),
                    code: Code::Internal,
                });
            }
            Ok(())
        }
    }

    fn service(engine: Engine) -> (ConnectService<Arc<Engine>>, Arc<Engine>) {
        let engine = Arc::new(engine);
        let manager = ExecutionManager::new(ManagerConfig::default());
        (ConnectService::new(manager, engine.clone()), engine)
    }

    fn set(service: &ConnectService<Arc<Engine>>, session: &str, key: &str, value: &str) {
        let context = service.session("u", session, None).unwrap();
        let set = config_request::operation::OpType::Set(config_request::Set {
            pairs: vec![KeyValue::new(key, value)],
            ..Default::default()
        });
        service.conf_answer(&context, Some(set)).unwrap();
    }

    fn get(service: &ConnectService<Arc<Engine>>, session: &str, key: &str) -> Option<String> {
        let context = service.session("u", session, None).unwrap();
        let get = config_request::operation::OpType::GetOption(config_request::GetOption {
            keys: vec![key.to_owned()],
        });
        let (pairs, _) = service.conf_answer(&context, Some(get)).unwrap();
        pairs[0].value.clone()
    }

    fn clone_request(target: Option<&str>) -> CloneSessionRequest {
        CloneSessionRequest {
            session_id: SOURCE.into(),
            user_context: Some(UserContext::new("u")),
            new_session_id: target.map(str::to_owned),
            ..Default::default()
        }
    }

    fn exists(service: &ConnectService<Arc<Engine>>, session: &str) -> bool {
        let key = SessionKey {
            user_id: Arc::from("u"),
            session_id: crate::execution::keys::parse_uuid(session).unwrap(),
        };
        service.manager().server_side_session_id(&key).is_some()
    }

    /// connect §14: the target starts with the source's configuration and the engine is
    /// asked to copy its state; afterwards the two are independent.
    #[test]
    fn a_clone_copies_the_configuration_and_asks_the_engine() {
        let (service, engine) = service(Engine::default());
        set(&service, SOURCE, "k", "v1");
        let response = service
            .clone_session_rpc(&clone_request(Some(TARGET)))
            .unwrap();
        assert_eq!(response.new_session_id, TARGET);
        assert_eq!(get(&service, TARGET, "k").as_deref(), Some("v1"));
        set(&service, TARGET, "k", "v2");
        set(&service, SOURCE, "only", "source");
        assert_eq!(get(&service, SOURCE, "k").as_deref(), Some("v1"));
        assert_eq!(get(&service, TARGET, "k").as_deref(), Some("v2"));
        assert_eq!(get(&service, TARGET, "only"), None);
        let clones = engine.clones.lock().unwrap();
        assert_eq!(clones.len(), 1);
        assert_eq!(clones[0].0.session_id, SOURCE);
        assert_eq!(
            clones[0].0.server_side_session_id,
            response.server_side_session_id
        );
        assert_eq!(clones[0].1.session_id, TARGET);
        assert_eq!(
            clones[0].1.server_side_session_id,
            response.new_server_side_session_id
        );
        // The config of the target answers under its own server-side id.
        let observed = ConfigRequest {
            session_id: TARGET.into(),
            user_context: Some(UserContext::new("u")),
            client_observed_server_side_session_id: Some(response.new_server_side_session_id),
            ..Default::default()
        };
        assert!(
            service
                .session(
                    "u",
                    &observed.session_id,
                    observed.client_observed_server_side_session_id.as_deref()
                )
                .is_ok()
        );
    }

    /// connect §14: an engine that refuses (or panics) leaves neither the target session nor
    /// its configuration, and the target id can be used again.
    #[test]
    fn a_refused_clone_leaves_nothing() {
        for (refuse, panic) in [(true, false), (false, true)] {
            let (service, _) = service(Engine {
                refuse,
                panic,
                ..Engine::default()
            });
            set(&service, SOURCE, "k", "v1");
            let e = service
                .clone_session_rpc(&clone_request(Some(TARGET)))
                .unwrap_err();
            let want = if refuse {
                "[ENGINE]"
            } else {
                "[INTERNAL_ERROR]"
            };
            assert!(e.message().starts_with(want), "{e}");
            assert!(!exists(&service, TARGET));
            assert_eq!(service.inner.confs.lock().unwrap().len(), 1);
            assert_eq!(service.manager().stats().sessions, 1);
            // The id is free: a session created under it starts empty.
            assert_eq!(get(&service, TARGET, "k"), None);
        }
    }

    /// connect §14.2: a failed clone (unknown source, taken target) creates no session.
    #[test]
    fn refusals_create_nothing() {
        let (service, engine) = service(Engine::default());
        let e = service
            .clone_session_rpc(&clone_request(Some(TARGET)))
            .unwrap_err();
        assert_eq!(e.condition(), Some("INVALID_HANDLE.SESSION_NOT_FOUND"));
        assert!(!exists(&service, SOURCE) && !exists(&service, TARGET));
        set(&service, SOURCE, "k", "v");
        set(&service, TARGET, "k", "taken");
        let e = service
            .clone_session_rpc(&clone_request(Some(TARGET)))
            .unwrap_err();
        let ConnectError::Spark(spark) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            spark.condition.as_deref(),
            Some("INVALID_CLONE_SESSION_REQUEST.TARGET_SESSION_ID_ALREADY_EXISTS")
        );
        assert_eq!(get(&service, TARGET, "k").as_deref(), Some("taken"));
        assert!(engine.clones.lock().unwrap().is_empty());
    }
}
