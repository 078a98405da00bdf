//! The worker specification (udf §1.9): how the engine installs, verifies, starts, reaches
//! and cleans up a UDF worker, and what the worker can do.
//!
//! These messages are configuration, not traffic on the `Execute` stream: a worker ships a
//! [`UdfWorkerSpecification`] and the engine's dispatcher acts on it (udf §6).

use std::collections::BTreeMap;

/// Everything the engine needs to run a kind of UDF worker (udf §1.9). The 4.3.0 schema has
/// fields 1–3 only.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfWorkerSpecification {
    /// Field 1: setup / verification / cleanup callables (required; udf §1.9).
    #[prost(message, optional, tag = "1")]
    pub environment: Option<WorkerEnvironment>,
    /// Field 2: what the worker supports, used for planning (required; udf §1.9).
    #[prost(message, optional, tag = "2")]
    pub capabilities: Option<WorkerCapabilities>,
    /// How workers are created (required; only direct creation exists so far; udf §1.9).
    #[prost(oneof = "udf_worker_specification::Worker", tags = "3")]
    pub worker: Option<udf_worker_specification::Worker>,
}

/// Oneof types nested in [`UdfWorkerSpecification`] (udf §1.9).
pub mod udf_worker_specification {
    /// The branches of [`UdfWorkerSpecification::worker`](super::UdfWorkerSpecification::worker)
    /// (udf §1.9).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Worker {
        /// Field 3: the engine spawns the worker process itself (udf §1.9, §6.1).
        #[prost(message, tag = "3")]
        Direct(super::DirectWorker),
    }
}

/// Callables run once per executor around worker creation: verification, then installation
/// if verification failed or is absent, then (after all workers ended) cleanup (udf §1.9,
/// udf §6.3). All are optional, but a verification callable requires an installation callable.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerEnvironment {
    /// Field 1: installs the runtime, dependencies and worker binaries (required when
    /// [`environment_verification`](Self::environment_verification) is set; udf §1.9).
    #[prost(message, optional, tag = "1")]
    pub installation: Option<ProcessCallable>,
    /// Field 2: checks that the worker and its dependencies are present (udf §1.9).
    #[prost(message, optional, tag = "2")]
    pub environment_verification: Option<ProcessCallable>,
    /// Field 3: runs after every worker has terminated, to remove temporary resources
    /// (udf §1.9).
    #[prost(message, optional, tag = "3")]
    pub environment_cleanup: Option<ProcessCallable>,
}

/// What a worker supports, used for query planning and execution (udf §1.9).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerCapabilities {
    /// Field 1: [`UdfWorkerDataFormat`](crate::wire::UdfWorkerDataFormat)s the worker accepts
    /// and produces, as raw `i32`s (packed on the wire); must include `Arrow` (udf §1.9).
    #[prost(enumeration = "crate::wire::UdfWorkerDataFormat", repeated, tag = "1")]
    pub supported_data_formats: Vec<i32>,
    /// Field 2: every
    /// [`UdfProtoCommunicationPattern`](crate::wire::UdfProtoCommunicationPattern) the worker
    /// supports, as raw `i32`s (packed on the wire) (udf §1.9).
    #[prost(
        enumeration = "crate::wire::UdfProtoCommunicationPattern",
        repeated,
        tag = "2"
    )]
    pub supported_communication_patterns: Vec<i32>,
    /// Field 3: whether one worker can run several UDF sessions concurrently; not used by the
    /// engine yet (udf §1.9).
    #[prost(bool, optional, tag = "3")]
    pub supports_concurrent_udfs: Option<bool>,
    /// Field 4: whether a worker may be reused for later invocations; when false it is
    /// terminated after each one (udf §1.9).
    #[prost(bool, optional, tag = "4")]
    pub supports_reuse: Option<bool>,
}

/// A worker process the engine spawns and stops itself (udf §1.9, §6.1).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct DirectWorker {
    /// Field 1: the blocking worker command, stopped with SIGTERM then SIGKILL (required;
    /// udf §1.9).
    #[prost(message, optional, tag = "1")]
    pub runner: Option<ProcessCallable>,
    /// Field 2: timeouts and the connection endpoint (required; udf §1.9).
    #[prost(message, optional, tag = "2")]
    pub properties: Option<UdfWorkerProperties>,
}

/// Timeouts and connection of a [`DirectWorker`] (udf §1.9).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UdfWorkerProperties {
    /// Field 1: milliseconds to wait for the worker to accept connections; the engine caps it
    /// with its own maximum (udf §1.9, §7).
    #[prost(int32, optional, tag = "1")]
    pub initialization_timeout_ms: Option<i32>,
    /// Field 2: milliseconds between SIGTERM and SIGKILL on engine-initiated termination;
    /// the engine caps it with its own maximum (udf §1.9, §7).
    #[prost(int32, optional, tag = "2")]
    pub graceful_termination_timeout_ms: Option<i32>,
    /// Field 3: the single endpoint all of the worker's sessions share (required; udf §1.9).
    #[prost(message, optional, tag = "3")]
    pub connection: Option<WorkerConnectionSpec>,
}

/// The transport of a worker's single connection endpoint (udf §1.9, §6.4).
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct WorkerConnectionSpec {
    /// Which transport (required; udf §1.9).
    #[prost(oneof = "worker_connection_spec::Transport", tags = "1, 2")]
    pub transport: Option<worker_connection_spec::Transport>,
}

/// Oneof types nested in [`WorkerConnectionSpec`] (udf §1.9).
pub mod worker_connection_spec {
    /// The branches of
    /// [`WorkerConnectionSpec::transport`](super::WorkerConnectionSpec::transport)
    /// (udf §1.9).
    #[derive(Clone, PartialEq, ::prost::Oneof)]
    pub enum Transport {
        /// Field 1: a Unix domain socket; the engine passes the socket path.
        #[prost(message, tag = "1")]
        UnixDomainSocket(super::UnixDomainSocket),
        /// Field 2: localhost TCP; the engine passes a port the worker binds on both
        /// 127.0.0.1 and ::1.
        #[prost(message, tag = "2")]
        Tcp(super::LocalTcpConnection),
    }
}

/// Marker: the worker listens on a Unix domain socket whose path the engine passes as
/// `--connection PATH` (udf §1.9). Has no fields.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct UnixDomainSocket {}

/// Marker: the worker listens on localhost TCP at the port the engine passes as
/// `--connection PORT` (udf §1.9). Has no fields.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct LocalTcpConnection {}

/// A process to run: executable, arguments and environment (udf §1.9). Exit code 0 means
/// success. The engine always appends `--id <worker id>` and `--connection <address>` itself.
#[derive(Clone, PartialEq, ::prost::Message)]
pub struct ProcessCallable {
    /// Field 1: the executable and any leading words, e.g. `["python3", "-m"]` (required;
    /// udf §1.9).
    #[prost(string, repeated, tag = "1")]
    pub command: Vec<String>,
    /// Field 2: arguments after the command; must not contain `--id` or `--connection`
    /// (udf §1.9).
    #[prost(string, repeated, tag = "2")]
    pub arguments: Vec<String>,
    /// Field 3: environment variables for the process, name to value (udf §1.9).
    #[prost(btree_map = "string, string", tag = "3")]
    pub environment_variables: BTreeMap<String, String>,
}

/// Chainable construction of the common case (udf §1.9): a direct worker on a Unix socket,
/// ARROW data, bidirectional streaming, no environment callables, the engine's default
/// timeouts. Every `with_*` method sets one field and leaves the rest as it is; the result
/// is an ordinary message, so any field can still be set directly.
///
/// ```
/// use std::time::Duration;
/// use tether::wire::UdfWorkerSpecification;
///
/// let spec = UdfWorkerSpecification::direct_unix(["python3", "-m", "my_worker"])
///     .with_arguments(["--verbose"])
///     .with_env("PYTHONUNBUFFERED", "YES")
///     .with_reuse(true)
///     .with_initialization_timeout(Duration::from_secs(5));
/// # let _ = spec;
/// ```
impl UdfWorkerSpecification {
    /// A worker the engine spawns itself (`direct`, udf §6.1) with `command` (the
    /// executable and any leading words, `ProcessCallable.command`), listening on the Unix
    /// socket whose path the engine appends as `--connection` (`unix_domain_socket`, the
    /// transport Spark's gRPC dispatcher requires, udf §6.4). Capabilities: `ARROW` and
    /// `BIDIRECTIONAL_STREAMING`, the minimum a dispatcher accepts (udf §6.2); reuse and
    /// concurrency unset (Spark's "not used yet"). An empty `WorkerEnvironment` and unset
    /// timeouts (the engine's defaults, udf §7).
    pub fn direct_unix<C, S>(command: C) -> Self
    where
        C: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let transport = worker_connection_spec::Transport::UnixDomainSocket(UnixDomainSocket {});
        Self::direct(command, transport)
    }

    /// As [`direct_unix`](Self::direct_unix), but the worker listens on local TCP at the
    /// port the engine appends as `--connection` (`tcp`, udf §1.9). Spark's gRPC dispatcher
    /// refuses it (udf §6.4); tether's dispatcher takes it only with `allow_tcp`.
    pub fn direct_tcp<C, S>(command: C) -> Self
    where
        C: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::direct(
            command,
            worker_connection_spec::Transport::Tcp(LocalTcpConnection {}),
        )
    }

    fn direct<C, S>(command: C, transport: worker_connection_spec::Transport) -> Self
    where
        C: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let pattern = crate::wire::UdfProtoCommunicationPattern::BidirectionalStreaming;
        Self {
            environment: Some(WorkerEnvironment::default()),
            capabilities: Some(WorkerCapabilities {
                supported_data_formats: vec![crate::wire::UdfWorkerDataFormat::Arrow as i32],
                supported_communication_patterns: vec![pattern as i32],
                supports_concurrent_udfs: None,
                supports_reuse: None,
            }),
            worker: Some(udf_worker_specification::Worker::Direct(DirectWorker {
                runner: Some(ProcessCallable {
                    command: command.into_iter().map(Into::into).collect(),
                    arguments: Vec::new(),
                    environment_variables: BTreeMap::new(),
                }),
                properties: Some(UdfWorkerProperties {
                    initialization_timeout_ms: None,
                    graceful_termination_timeout_ms: None,
                    connection: Some(WorkerConnectionSpec {
                        transport: Some(transport),
                    }),
                }),
            })),
        }
    }

    /// Appends `arguments` to the runner's `ProcessCallable.arguments` (udf §1.9; they come
    /// before the `--id` and `--connection` the engine appends, and may not contain them).
    pub fn with_arguments<A, S>(mut self, arguments: A) -> Self
    where
        A: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let runner = self.runner_mut();
        runner
            .arguments
            .extend(arguments.into_iter().map(Into::into));
        self
    }

    /// Sets the environment variable `name` to `value` for the worker process (the runner's
    /// `ProcessCallable.environment_variables`, udf §1.9).
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let runner = self.runner_mut();
        runner
            .environment_variables
            .insert(name.into(), value.into());
        self
    }

    /// Replaces the declared data formats (`WorkerCapabilities.supported_data_formats`,
    /// udf §1.9). The list must contain `ARROW` and not `UNSPECIFIED`, or a dispatcher
    /// refuses the spec (udf §6.2).
    pub fn with_data_formats<I>(mut self, formats: I) -> Self
    where
        I: IntoIterator<Item = crate::wire::UdfWorkerDataFormat>,
    {
        let capabilities = self.capabilities.get_or_insert_with(Default::default);
        capabilities.supported_data_formats = formats.into_iter().map(|f| f as i32).collect();
        self
    }

    /// Declares whether a worker may serve later sessions after its first
    /// (`WorkerCapabilities.supports_reuse`, udf §1.9; a reuse pool needs it, udf §6.6).
    pub fn with_reuse(mut self, supported: bool) -> Self {
        let capabilities = self.capabilities.get_or_insert_with(Default::default);
        capabilities.supports_reuse = Some(supported);
        self
    }

    /// Declares whether one worker can run several sessions at once
    /// (`WorkerCapabilities.supports_concurrent_udfs`, udf §1.9; not used by the engine yet).
    pub fn with_concurrent_udfs(mut self, supported: bool) -> Self {
        let capabilities = self.capabilities.get_or_insert_with(Default::default);
        capabilities.supports_concurrent_udfs = Some(supported);
        self
    }

    /// How long the engine waits for the worker to accept connections
    /// (`UdfWorkerProperties.initialization_timeout_ms`, udf §1.9, §7): whole milliseconds,
    /// rounded up, saturating at `i32::MAX`. Zero means the engine's default (10 s); the
    /// engine caps values above its maximum (30 s).
    pub fn with_initialization_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.properties_mut().initialization_timeout_ms = Some(millis(timeout));
        self
    }

    /// How long the engine waits between SIGTERM and SIGKILL when it stops the worker
    /// (`UdfWorkerProperties.graceful_termination_timeout_ms`, udf §1.9, §6.1, §7): whole
    /// milliseconds, rounded up, saturating at `i32::MAX`. Zero means the engine's default
    /// (5 s); the engine caps values above its maximum (30 s).
    pub fn with_graceful_termination_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.properties_mut().graceful_termination_timeout_ms = Some(millis(timeout));
        self
    }

    /// Sets the installation, verification and cleanup callables (`environment`, udf §1.9,
    /// §6.3).
    pub fn with_environment(mut self, environment: WorkerEnvironment) -> Self {
        self.environment = Some(environment);
        self
    }

    fn direct_mut(&mut self) -> &mut DirectWorker {
        let worker = self.worker.get_or_insert_with(|| {
            udf_worker_specification::Worker::Direct(DirectWorker::default())
        });
        match worker {
            udf_worker_specification::Worker::Direct(direct) => direct,
        }
    }

    fn runner_mut(&mut self) -> &mut ProcessCallable {
        self.direct_mut()
            .runner
            .get_or_insert_with(Default::default)
    }

    fn properties_mut(&mut self) -> &mut UdfWorkerProperties {
        self.direct_mut()
            .properties
            .get_or_insert_with(Default::default)
    }
}

/// A duration as the spec's `int32` milliseconds (udf §1.9): rounded up, so that a
/// non-zero duration never reads as "unset", and saturating.
fn millis(duration: std::time::Duration) -> i32 {
    let millis = duration.as_nanos().div_ceil(1_000_000);
    i32::try_from(millis).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{UdfProtoCommunicationPattern, UdfWorkerDataFormat};
    use prost::Message;

    fn roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>(m: &M) -> Vec<u8> {
        let encoded = m.encode_to_vec();
        assert_eq!(encoded.len(), m.encoded_len());
        assert_eq!(&M::decode(encoded.as_slice()).expect("decodes"), m);
        encoded
    }

    fn empty_roundtrip<M: Message + Default + PartialEq + std::fmt::Debug>() {
        assert_eq!(roundtrip(&M::default()), Vec::<u8>::new());
    }

    fn callable(cmd: &str) -> ProcessCallable {
        ProcessCallable {
            command: vec![cmd.into(), "-m".into()],
            arguments: vec!["worker".into(), "--max_concurrency".into(), "5".into()],
            environment_variables: [("PYTHONPATH".to_string(), "/opt/w".to_string())].into(),
        }
    }

    fn full_spec() -> UdfWorkerSpecification {
        UdfWorkerSpecification {
            environment: Some(WorkerEnvironment {
                installation: Some(callable("install")),
                environment_verification: Some(callable("verify")),
                environment_cleanup: Some(callable("cleanup")),
            }),
            capabilities: Some(WorkerCapabilities {
                supported_data_formats: vec![UdfWorkerDataFormat::Arrow as i32],
                supported_communication_patterns: vec![
                    UdfProtoCommunicationPattern::BidirectionalStreaming as i32,
                ],
                supports_concurrent_udfs: Some(false),
                supports_reuse: Some(true),
            }),
            worker: Some(udf_worker_specification::Worker::Direct(DirectWorker {
                runner: Some(callable("python3")),
                properties: Some(UdfWorkerProperties {
                    initialization_timeout_ms: Some(5_000),
                    graceful_termination_timeout_ms: Some(10_000),
                    connection: Some(WorkerConnectionSpec {
                        transport: Some(worker_connection_spec::Transport::UnixDomainSocket(
                            UnixDomainSocket {},
                        )),
                    }),
                }),
            })),
        }
    }

    #[test]
    fn the_builder_writes_the_nested_messages_a_dispatcher_expects() {
        use std::time::Duration;
        let spec = UdfWorkerSpecification::direct_unix(["python3", "-m"])
            .with_arguments(["worker"])
            .with_arguments([String::from("-v")])
            .with_env("PYTHONPATH", "/opt/w")
            .with_reuse(true)
            .with_concurrent_udfs(false)
            .with_initialization_timeout(Duration::from_secs(5))
            .with_graceful_termination_timeout(Duration::from_secs(10))
            .with_environment(WorkerEnvironment {
                installation: Some(callable("install")),
                environment_verification: Some(callable("verify")),
                environment_cleanup: Some(callable("cleanup")),
            });
        let mut expected = full_spec();
        let Some(udf_worker_specification::Worker::Direct(direct)) = expected.worker.as_mut()
        else {
            unreachable!("full_spec is direct")
        };
        direct.runner.as_mut().unwrap().arguments = vec!["worker".into(), "-v".into()];
        expected
            .capabilities
            .as_mut()
            .unwrap()
            .supports_concurrent_udfs = Some(false);
        assert_eq!(spec, expected);

        let minimal = UdfWorkerSpecification::direct_unix(["/bin/w"]);
        let caps = minimal.capabilities.clone().unwrap();
        assert_eq!(
            caps.supported_data_formats,
            vec![UdfWorkerDataFormat::Arrow as i32]
        );
        assert_eq!(caps.supports_reuse, None);
        let tcp = UdfWorkerSpecification::direct_tcp(["/bin/w"])
            .with_data_formats([UdfWorkerDataFormat::Arrow]);
        let Some(udf_worker_specification::Worker::Direct(direct)) = tcp.worker else {
            unreachable!("direct_tcp is direct")
        };
        let transport = direct.properties.unwrap().connection.unwrap().transport;
        assert_eq!(
            transport,
            Some(worker_connection_spec::Transport::Tcp(
                LocalTcpConnection {}
            ))
        );
        // Setters also work on a spec that started empty.
        let patched = UdfWorkerSpecification::default().with_arguments(["a"]);
        assert!(patched.worker.is_some());
    }

    #[test]
    fn builder_timeouts_round_up_and_saturate() {
        use std::time::Duration;
        assert_eq!(millis(Duration::ZERO), 0);
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
        assert_eq!(millis(Duration::MAX), i32::MAX);
    }

    #[test]
    fn every_spec_message_roundtrips_when_empty() {
        empty_roundtrip::<UdfWorkerSpecification>();
        empty_roundtrip::<WorkerEnvironment>();
        empty_roundtrip::<WorkerCapabilities>();
        empty_roundtrip::<DirectWorker>();
        empty_roundtrip::<UdfWorkerProperties>();
        empty_roundtrip::<WorkerConnectionSpec>();
        empty_roundtrip::<UnixDomainSocket>();
        empty_roundtrip::<LocalTcpConnection>();
        empty_roundtrip::<ProcessCallable>();
        let empty = UdfWorkerSpecification::default();
        assert_eq!(empty.environment, None);
        assert_eq!(empty.worker, None);
    }

    #[test]
    fn every_spec_message_roundtrips_with_all_fields() {
        let spec = full_spec();
        let bytes = roundtrip(&spec);
        let decoded = UdfWorkerSpecification::decode(bytes.as_slice()).unwrap();
        let caps = decoded.capabilities.clone().unwrap();
        assert_eq!(
            caps.supported_data_formats().collect::<Vec<_>>(),
            vec![UdfWorkerDataFormat::Arrow]
        );
        assert_eq!(caps.supports_reuse, Some(true));
        let Some(udf_worker_specification::Worker::Direct(direct)) = decoded.worker else {
            panic!("direct worker expected");
        };
        let props = direct.properties.clone().unwrap();
        assert_eq!(props.initialization_timeout_ms, Some(5_000));
        assert_eq!(
            direct.runner.as_ref().unwrap().command,
            vec!["python3", "-m"]
        );
        roundtrip(decoded.environment.as_ref().unwrap());
        roundtrip(&caps);
        roundtrip(&direct);
        roundtrip(&props);
        roundtrip(&callable("x"));
        roundtrip(&WorkerConnectionSpec {
            transport: Some(worker_connection_spec::Transport::Tcp(
                LocalTcpConnection {},
            )),
        });
        roundtrip(&UnixDomainSocket {});
        roundtrip(&LocalTcpConnection {});
    }

    #[test]
    fn literal_bytes_match_the_schema() {
        // tcp = field 2 of the transport oneof, an empty message.
        let tcp = WorkerConnectionSpec {
            transport: Some(worker_connection_spec::Transport::Tcp(
                LocalTcpConnection {},
            )),
        };
        assert_eq!(tcp.encode_to_vec(), vec![0x12, 0x00]);
        let uds = WorkerConnectionSpec {
            transport: Some(worker_connection_spec::Transport::UnixDomainSocket(
                UnixDomainSocket {},
            )),
        };
        assert_eq!(uds.encode_to_vec(), vec![0x0A, 0x00]);
        // direct = field 3 of UDFWorkerSpecification.
        let spec = UdfWorkerSpecification {
            worker: Some(udf_worker_specification::Worker::Direct(
                DirectWorker::default(),
            )),
            ..UdfWorkerSpecification::default()
        };
        assert_eq!(spec.encode_to_vec(), vec![0x1A, 0x00]);
        // Repeated enums are packed: field 1, length 2, values 1 and 0.
        let caps = WorkerCapabilities {
            supported_data_formats: vec![1, 0],
            ..WorkerCapabilities::default()
        };
        assert_eq!(caps.encode_to_vec(), vec![0x0A, 0x02, 0x01, 0x00]);
        // ... and the unpacked form other encoders may emit decodes the same.
        let unpacked = WorkerCapabilities::decode(&[0x08, 0x01, 0x08, 0x00][..]).unwrap();
        assert_eq!(unpacked.supported_data_formats, vec![1, 0]);
        // Timeouts are int32 varints on fields 1 and 2.
        let props = UdfWorkerProperties {
            initialization_timeout_ms: Some(300),
            graceful_termination_timeout_ms: Some(0),
            connection: None,
        };
        assert_eq!(props.encode_to_vec(), vec![0x08, 0xAC, 0x02, 0x10, 0x00]);
        // Repeated strings and the environment map.
        let callable = ProcessCallable {
            command: vec!["a".into()],
            arguments: vec!["b".into(), "c".into()],
            environment_variables: [("K".to_string(), "V".to_string())].into(),
        };
        assert_eq!(
            callable.encode_to_vec(),
            vec![
                0x0A, 0x01, b'a', // 1: command
                0x12, 0x01, b'b', 0x12, 0x01, b'c', // 2: arguments
                0x1A, 0x06, 0x0A, 0x01, b'K', 0x12, 0x01, b'V', // 3: environment_variables
            ]
        );
    }

    #[test]
    fn unknown_capability_values_are_kept_but_skipped_by_the_getter() {
        let caps = WorkerCapabilities {
            supported_data_formats: vec![1, 9],
            ..WorkerCapabilities::default()
        };
        let decoded = WorkerCapabilities::decode(roundtrip(&caps).as_slice()).unwrap();
        assert_eq!(decoded.supported_data_formats, vec![1, 9]);
        assert_eq!(
            decoded.supported_data_formats().collect::<Vec<_>>(),
            vec![UdfWorkerDataFormat::Arrow]
        );
    }
}
