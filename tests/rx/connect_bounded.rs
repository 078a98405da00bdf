//! The Spark Connect service served with bounded HTTP/2 buffers (`ConnectServer`, connect
//! §4 transport) over a manager with a small memory budget (tether's bound over rx §3.1's
//! unsent and retained responses): many executions multiplexed on two channels stall, then
//! drain with every response once and in order, and the server shuts down on request.

#![cfg(feature = "spark-connect")]

use std::time::Duration;

use futures::StreamExt;
use tether::execution::client::ExecutionRpc;
use tether::execution::{ConnectError, ExecutionManager, ManagerConfig, StreamLimits};
use tether::spark::connect::{
    ConnectClient, ConnectServer, ConnectService, QueryEngine, ResponseSource, SessionContext,
    TransportLimits,
};
use tether::wire::connect::ExecutePlanRequest;
use tether_testing::connect::{self, Caller};
use tokio::net::TcpListener;
use tonic::transport::Endpoint;

const RESPONSES: i64 = 20;
const PAYLOAD: usize = 4 * 1024;

/// Every plan: `RESPONSES` batches of `PAYLOAD` bytes numbered from 1.
struct Numbered;

impl QueryEngine for Numbered {
    fn execute(
        &self,
        _: &SessionContext,
        _: &ExecutePlanRequest,
    ) -> Result<ResponseSource, ConnectError> {
        let batches = (1..=RESPONSES).map(|i| Ok(connect::batch_of_len(i, PAYLOAD)));
        Ok(futures::stream::iter(batches).boxed())
    }
}

#[test]
fn the_transport_bound_adds_up() {
    let limits = TransportLimits::default();
    assert_eq!(limits.max_send_buf_size, 64 * 1024, "below hyper's 400 KiB");
    let one = limits.per_stream_bound(10_000);
    assert!(one >= limits.max_send_buf_size as u64 + 10_000);
    assert_eq!(
        limits.bound(1_000, 4, 10_000),
        1_000 * one + 4 * limits.per_connection_bound()
    );
    assert!(limits.per_connection_bound() >= u64::from(limits.connection_window));
}

/// Limits that would panic HTTP/2 (a frame size out of its range) or stall every client (a
/// window, send buffer or stream limit of 0) are refused in words, and `serve` refuses them
/// before it serves.
#[tokio::test]
async fn limits_that_cannot_serve_are_refused() {
    let ok = TransportLimits::default();
    assert_eq!(ok.check(), Ok(()));
    let cases = [
        TransportLimits {
            max_frame_size: 100,
            ..ok
        },
        TransportLimits {
            max_frame_size: 1 << 24,
            ..ok
        },
        TransportLimits {
            stream_window: 0,
            ..ok
        },
        TransportLimits {
            connection_window: 1 << 31,
            ..ok
        },
        TransportLimits {
            max_send_buf_size: 0,
            ..ok
        },
        TransportLimits {
            max_concurrent_streams: 0,
            ..ok
        },
    ];
    for limits in cases {
        let why = limits.check().expect_err("refused");
        let manager = ExecutionManager::new(ManagerConfig::default());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e = ConnectServer::new(ConnectService::new(manager, Numbered))
            .limits(limits)
            .serve(listener, std::future::pending())
            .await
            .expect_err("refused by serve");
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), why);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_streams_over_a_bounded_server_drain_completely() {
    const EXECUTIONS: usize = 200;
    const BUDGET: u64 = 256 * 1024;
    let manager = ExecutionManager::new(ManagerConfig {
        memory_budget: Some(BUDGET),
        stream: StreamLimits {
            max_duration: None,
            max_bytes: None,
        },
        ..ManagerConfig::default()
    });
    let service = ConnectService::new(manager.clone(), Numbered);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        ConnectServer::new(service)
            .limits(TransportLimits::default())
            .drain_deadline(Duration::ZERO)
            .serve(listener, async move {
                let _ = stopped.await;
            }),
    );
    let mut clients = Vec::new();
    for _ in 0..2 {
        // Room for every stalled stream's 8 KiB window on the channel.
        let channel = Endpoint::from_shared(address.clone())
            .unwrap()
            .initial_stream_window_size(8 * 1024)
            .initial_connection_window_size(4 * 1024 * 1024)
            .connect()
            .await
            .unwrap();
        clients.push(ConnectClient::with_channel(channel, None).unwrap());
    }
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let (first_tx, mut first_rx) = tokio::sync::mpsc::channel(EXECUTIONS);
    let mut consumers = Vec::new();
    for i in 0..EXECUTIONS {
        let client = clients[i % 2].clone();
        let request =
            Caller::new("u", "6f1b7c4e-8a39-4d2c-9e51-0b3a2f7d8c91").execute(&connect::op_id());
        let mut drain = drain_rx.clone();
        let first_tx = first_tx.clone();
        consumers.push(tokio::spawn(async move {
            let mut stream = client.execute_plan(request).await.unwrap();
            let mut got = vec![stream.next().await.unwrap().unwrap()];
            first_tx.send(()).await.unwrap();
            drain.wait_for(|d| *d).await.unwrap();
            while let Some(r) = stream.next().await {
                got.push(r.unwrap());
            }
            got
        }));
    }
    for _ in 0..EXECUTIONS {
        tokio::time::timeout(Duration::from_secs(30), first_rx.recv())
            .await
            .expect("every stream gets its first response")
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let budget = manager.memory_budget().unwrap().clone();
    let stalled = budget.usage();
    let largest = 2 * PAYLOAD as u64;
    assert!(
        stalled.used <= budget.bound(EXECUTIONS as u64, largest),
        "{stalled:?}"
    );
    assert!(
        stalled.waiting > 0,
        "producers wait at the budget: {stalled:?}"
    );
    drain_tx.send(true).unwrap();
    let mut ids = std::collections::HashSet::new();
    for c in consumers {
        let got = tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .expect("every stream drains")
            .unwrap();
        let rows: Vec<i64> = got.iter().filter_map(connect::rows).collect();
        assert_eq!(rows, (1..=RESPONSES).collect::<Vec<_>>());
        assert!(got.last().unwrap().is_result_complete());
        for r in got {
            assert!(ids.insert(r.response_id), "a response arrived twice");
        }
    }
    assert_eq!(ids.len(), EXECUTIONS * (RESPONSES as usize + 1));
    assert!(budget.usage().peak <= budget.bound(EXECUTIONS as u64, largest));
    stop.send(()).unwrap();
    // Its drain cancels at once and waits DRAIN_GRACE for these raw clients (they never
    // release), then abandons what they left.
    tokio::time::timeout(Duration::from_secs(15), server)
        .await
        .expect("the server stops when asked")
        .unwrap()
        .unwrap();
}

/// A token no client could send is refused before the server serves anything: `serve`
/// returns `InvalidInput` saying why, and the listener is closed with it.
#[tokio::test]
async fn a_token_no_client_can_send_is_refused_before_serving() {
    let manager = ExecutionManager::new(ManagerConfig::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let e = ConnectServer::new(ConnectService::new(manager, Numbered))
        .token("two words\n")
        .serve(listener, std::future::pending())
        .await
        .expect_err("refused");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().starts_with("the token holds"), "{e}");
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "nothing listens any more"
    );
}
