//! The crate's one error rule, checked on representative errors of every layer: an error's
//! `Display` states the error without repeating its cause; the cause is reached through
//! `std::error::Error::source()`.

use std::error::Error;
use std::io;
use std::time::Duration;

use bytes::BytesMut;
use tether::connection::ConnectionError;
use tether::execution::ForwardError;
use tether::execution::client::{ClientError, RpcError, Violation};
use tether::wire::{ExecutionError, FrameCodec, MalformedMessage, UdfResponse};
use tether::worker::endpoint::{EndpointError, EngineViolation};
use tether::worker::engine::{Interrupted, PeerViolation, SessionError, TransportFailure};
#[cfg(feature = "tokio")]
use tether_testing::fixtures::{ScratchDir, error_chain};

/// Walks `error`'s source chain: no error's text contains its source's text, and the chain
/// is `depth` errors long (1: no source).
fn check(error: &(dyn Error + 'static), depth: usize) {
    let mut chain = Vec::new();
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(source) = e.source() {
            let (text, cause) = (e.to_string(), source.to_string());
            assert!(
                !text.contains(&cause),
                "{text:?} repeats its source {cause:?}"
            );
        }
        chain.push(e.to_string());
        current = e.source();
    }
    assert_eq!(chain.len(), depth, "source chain of {error:?}: {chain:?}");
}

fn io_error() -> io::Error {
    io::Error::other("connection reset by peer")
}

#[test]
fn transport_errors_keep_their_cause_as_the_source() {
    check(&ConnectionError::transport(io_error()), 2);
    check(&ConnectionError::Closed, 1);
    #[cfg(feature = "tokio")]
    {
        use tether::connection::framed::FramedError;
        check(&FramedError::Io(io_error()), 2);
        check(&ConnectionError::from(FramedError::Io(io_error())), 3);
    }
    let mut undecodable = BytesMut::from(&[0u8, 0, 0, 1, 0x0F][..]);
    let decode = FrameCodec::default()
        .decode::<UdfResponse>(&mut undecodable)
        .expect_err("an invalid wire type");
    check(&decode, 2);
}

#[test]
fn session_errors_keep_their_cause_as_the_source() {
    let malformed = PeerViolation::Malformed(MalformedMessage::EmptyResponse);
    check(&malformed, 2);
    check(&TransportFailure::Protocol(malformed.clone()), 3);
    check(
        &SessionError::Transport(TransportFailure::Protocol(malformed)),
        4,
    );
    // `TransportFailure::Connection` is transparent: it is the connection error.
    check(
        &SessionError::Transport(TransportFailure::Connection(ConnectionError::transport(
            io_error(),
        ))),
        3,
    );
    check(
        &SessionError::Execution(ExecutionError::user_with_class("boom", "UdfError")),
        2,
    );
    check(
        &SessionError::Interrupted(Interrupted {
            context: "waiting for InitResponse",
            waited: Duration::from_secs(2),
        }),
        2,
    );
    check(&SessionError::Cancelled, 1);
}

#[test]
fn worker_side_errors_keep_their_cause_as_the_source() {
    let violation = EngineViolation::Malformed(MalformedMessage::EmptyRequest);
    check(&violation, 2);
    check(&EndpointError::ProtocolViolation(violation), 3);
    check(
        &EndpointError::ProtocolViolation(EngineViolation::SecondInit {
            awaiting_chunks: false,
        }),
        2,
    );
    check(
        &EndpointError::Transport(ConnectionError::transport(io_error())),
        2,
    );
}

#[test]
fn execution_errors_keep_their_cause_as_the_source() {
    check(&ClientError::Violation(Violation::MissingResponseId), 2);
    check(
        &ClientError::RetriesExceeded {
            error: RpcError::unavailable("connection refused"),
            retries: 3,
        },
        2,
    );
    check(
        &ClientError::ResponseAlreadyReceived {
            error: RpcError::unavailable("operation not found"),
            delivered: 7,
        },
        2,
    );
    check(&ForwardError::<io::Error>::Sink(io_error()), 2);
}

#[cfg(feature = "tokio")]
#[test]
fn dispatcher_errors_keep_their_cause_as_the_source() {
    use std::sync::Arc;
    use tether::worker::dispatcher::{CallableStage, DispatchError, EnvironmentError, SpecError};
    check(&DispatchError::InvalidSpec(SpecError::MissingRunner), 2);
    let spawn = EnvironmentError::Spawn {
        stage: CallableStage::Installation,
        command: "pip install x".into(),
        source: Arc::new(io::Error::from(io::ErrorKind::NotFound)),
    };
    check(&spawn, 2);
    check(&DispatchError::EnvironmentPreviouslyFailed(spawn), 3);
    check(
        &DispatchError::Spawn {
            command: "worker --id 1".into(),
            source: io_error(),
        },
        2,
    );
    check(
        &DispatchError::Io {
            what: "creating the worker output log".into(),
            source: io_error(),
        },
        2,
    );
}

#[cfg(feature = "grpc")]
#[test]
fn grpc_errors_keep_their_cause_as_the_source() {
    use tether::spark::udf_grpc::ManageCallError;
    check(
        &ManageCallError::from(tonic::Status::unavailable("worker gone")),
        2,
    );
}

/// `error` keeps the OS error's kind, and its chain is exactly `expected`: the text naming
/// the socket, then the OS error.
#[cfg(feature = "tokio")]
fn assert_names_the_socket(error: &io::Error, kind: io::ErrorKind, expected: &[String]) {
    assert_eq!(error.kind(), kind);
    assert_eq!(error_chain(error), expected);
    check(error, 2);
}

/// The OS's text for `errno`, as `io::Error`'s `Display` prints it.
#[cfg(feature = "tokio")]
fn os_text(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn a_missing_socket_names_its_path_and_keeps_the_os_error_as_the_source() {
    use tether::connection::framed::{FramedConfig, connect_unix};
    use tether::wire::{UdfRequest, UdfResponse};
    let scratch = ScratchDir::new("err");
    let missing = scratch.join("w.sock");
    let expected = vec![
        format!("could not connect to the Unix socket {}", missing.display()),
        os_text(nix::libc::ENOENT),
    ];

    let framed = connect_unix::<UdfRequest, UdfResponse>(&missing, &FramedConfig::default())
        .await
        .expect_err("nothing listens there");
    assert_names_the_socket(&framed, io::ErrorKind::NotFound, &expected);

    #[cfg(feature = "grpc")]
    {
        use tether::spark::udf_grpc::{GrpcChannel, GrpcConfig};
        use tether::worker::engine::WorkerAddress;
        let endpoint = WorkerAddress::Unix(missing.clone());
        let grpc = GrpcChannel::connect(&endpoint, &GrpcConfig::default())
            .await
            .expect_err("nothing listens there");
        assert_names_the_socket(&grpc, io::ErrorKind::NotFound, &expected);
    }
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn an_address_in_use_names_the_socket_path_and_keeps_the_os_error_as_the_source() {
    use tether::connection::framed::FramedListener;
    let scratch = ScratchDir::new("err");
    let path = scratch.join("w.sock");
    let _first = FramedListener::bind_unix(&path).expect("the first bind succeeds");
    let expected = vec![
        format!("could not bind the Unix socket {}", path.display()),
        os_text(nix::libc::EADDRINUSE),
    ];

    let framed = FramedListener::bind_unix(&path).expect_err("the path is taken");
    assert_names_the_socket(&framed, io::ErrorKind::AddrInUse, &expected);

    #[cfg(feature = "grpc")]
    {
        use tether::spark::udf_grpc::{WorkerServer, WorkerService};
        let service = WorkerService::new(drop);
        let grpc = WorkerServer::bind_unix(&path, service).expect_err("the path is taken");
        assert_names_the_socket(&grpc, io::ErrorKind::AddrInUse, &expected);
    }
}
