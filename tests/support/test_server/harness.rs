//! The example server's test harnesses, served with tonic's own server rather than
//! `ConnectServer`: `--faults` (faults injected into the service and its connections,
//! module `faults`) and `--baseline` (the same engine without tether, module `baseline`).

use std::sync::Arc;
use std::time::Duration;

use tether::execution::DrainReport;
use tether::spark::connect::tls::{AcceptedStream, ClientCertificateCheck, ServerTls};
use tether::spark::connect::{ConnectConfig, ConnectService, QueryEngine};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use super::baseline;
use super::faults::{FaultService, Faults, KillableStream};
use super::{Args, Baseline, Paced, shutdown_signal};

// The stop's bounds are ConnectServer's, so the harnesses stop as the library's server does.
use tether::spark::connect::{CLOSE_WAIT, STOP_WAIT as HARD_STOP};

/// Why the server stopped without waiting for every open stream to end.
#[derive(Debug, Clone, Copy)]
enum ForcedStop {
    /// A second signal came, during the drain or after it.
    SecondSignal,
    /// Streams were still open [`HARD_STOP`] after the drain.
    StreamsOpen,
}

/// The server's shutdown: the first future resolves once a signal came and the drain of
/// `connect` ended (the server then stops accepting and ends its connections gracefully);
/// the second [`HARD_STOP`] later, or at a second signal, saying why, to stop without
/// waiting for what is still open. The drain's report lands in `report`.
fn drain_on_signal<E: QueryEngine>(
    connect: ConnectService<E>,
    deadline: Duration,
    report: Arc<std::sync::OnceLock<DrainReport>>,
) -> (
    impl std::future::Future<Output = ()>,
    impl std::future::Future<Output = ForcedStop>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<ForcedStop>();
    let drained = async move {
        shutdown_signal().await;
        println!(
            "draining: health NOT_SERVING, new sessions and executions refused, deadline {} ms",
            deadline.as_millis()
        );
        tokio::select! {
            drained = connect.drain(deadline) => {
                println!("{drained}");
                tracing::info!(report = %drained, "drained");
                let _ = report.set(drained);
                tokio::spawn(async move {
                    let why = tokio::select! {
                        () = tokio::time::sleep(HARD_STOP) => ForcedStop::StreamsOpen,
                        () = shutdown_signal() => ForcedStop::SecondSignal,
                    };
                    let _ = stop_tx.send(why);
                });
            }
            () = shutdown_signal() => {
                let _ = stop_tx.send(ForcedStop::SecondSignal);
            }
        }
    };
    let hard_stop = async move {
        match stop_rx.await {
            Ok(why) => why,
            // A dropped sender (the drain never began) never stops the server early.
            Err(_) => std::future::pending().await,
        }
    };
    (drained, hard_stop)
}

/// Serves the harness `args` asks for until a signal and its drain (or a forced stop);
/// `Some(why)` when the stop was forced.
pub(super) async fn serve(
    args: &Args,
    engine: Paced,
    connect: ConnectService<Paced>,
    tls: Option<ServerTls>,
    listener: TcpListener,
    faults: Option<Arc<Faults>>,
    drained: Arc<std::sync::OnceLock<DrainReport>>,
) -> Result<Option<&'static str>, Box<dyn std::error::Error>> {
    let manager = connect.manager().clone();
    let maintenance = tokio::spawn(manager.clone().run_maintenance());
    let publisher = args.metrics_addr.map(|_| {
        let manager = manager.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                manager.publish_metrics();
            }
        })
    });
    let health = connect.health().service().await;
    let (shutdown, hard_stop) = drain_on_signal(
        connect.clone(),
        Duration::from_millis(args.drain_timeout_ms),
        drained,
    );
    let service = connect.clone().into_service(&ConnectConfig {
        token: args.token.clone(),
    });
    // TCP_NODELAY on; over TLS, a client that speaks plaintext or (with mutual TLS)
    // presents no certificate is told so (`tls::incoming`, `ServerTls::server_builder`).
    let (mut server, connections): (_, futures::stream::BoxStream<'static, _>) = match tls {
        Some(tls) => (
            tls.server_builder(),
            Box::pin(tether::spark::connect::tls::incoming(listener)),
        ),
        None => (
            tonic::transport::Server::builder().layer(ClientCertificateCheck::default()),
            // Closed gracefully too (`AcceptedStream`), like the TLS connections.
            Box::pin(futures::StreamExt::map(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                |accepted| accepted.map(AcceptedStream::new),
            )),
        ),
    };
    let serving = async {
        match &faults {
            None if args.baseline.is_some() => {
                let rotate = args.baseline == Some(Baseline::BareRotating);
                tracing::info!(rotate, "serving the bare baseline, without tether");
                server
                    .add_service(health)
                    .add_service(baseline::Bare::new(engine.engine, rotate))
                    .serve_with_incoming_shutdown(connections, shutdown)
                    .await?;
            }
            None => {
                // Connections the drain's deadline can close (`ConnectService::connections`).
                server
                    .add_service(health)
                    .add_service(service)
                    .serve_with_incoming_shutdown(connect.connections(connections), shutdown)
                    .await?;
            }
            Some(faults) => {
                tracing::info!(seed = args.faults, "fault mode on");
                // Connections the faults can drop, and the drain's deadline close.
                let incoming = futures::StreamExt::map(connections, |accepted| {
                    accepted.map(KillableStream::new)
                });
                server
                    .add_service(health)
                    .add_service(FaultService::new(service, faults.clone()))
                    .serve_with_incoming_shutdown(connect.connections(incoming), shutdown)
                    .await?;
            }
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    };
    tokio::pin!(serving);
    let forced = tokio::select! {
        served = &mut serving => {
            served?;
            None
        }
        why = hard_stop => match why {
            // What is still open holds nothing of the service: requests that reached no
            // handler (a body that never came). Close their connections, then stop cleanly.
            ForcedStop::StreamsOpen
                if manager.execution_count() == 0 && connect.rpcs_in_flight() == 0 =>
            {
                connect.close_connections();
                println!(
                    "streams still open {} ms after the drain reached no handler: closed \
                     their connections",
                    HARD_STOP.as_millis()
                );
                match tokio::time::timeout(CLOSE_WAIT, &mut serving).await {
                    Ok(served) => {
                        served?;
                        None
                    }
                    Err(_) => {
                        println!("streams still open after their connections closed: stopping");
                        Some(ForcedStop::StreamsOpen)
                    }
                }
            }
            why => {
                match why {
                    ForcedStop::SecondSignal => println!("a second signal: stopping now"),
                    ForcedStop::StreamsOpen => println!(
                        "streams still open {} ms after the drain: stopping",
                        HARD_STOP.as_millis()
                    ),
                }
                Some(why)
            }
        }
    };
    maintenance.abort();
    if let Some(publisher) = publisher {
        publisher.abort();
    }
    Ok(forced.map(|why| match why {
        ForcedStop::SecondSignal => "a second signal",
        ForcedStop::StreamsOpen => "streams still open",
    }))
}
