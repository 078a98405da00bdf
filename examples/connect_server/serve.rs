// A server with TLS, a token, metrics and a graceful drain: the code of
// `tether::spark::connect::ConnectServer`'s documentation, as the example server runs it.
use std::future::Future;
use std::time::Duration;

use tether::execution::DrainReport;
use tether::spark::connect::tls::ServerTls;
use tether::spark::connect::{ConnectServer, ConnectService, QueryEngine};
use tokio::net::TcpListener;

/// Serves `service` on `listener` (TLS if `tls`, the token if `token`), publishing the
/// metrics every second, until `shutdown`; then drains, canceling what still runs after
/// `drain_deadline`, and returns the drain's report.
pub async fn serve(
    service: ConnectService<impl QueryEngine>,
    listener: TcpListener,
    tls: Option<ServerTls>,
    token: Option<String>,
    drain_deadline: Duration,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<DrainReport> {
    let mut server = ConnectServer::new(service)
        .publish_metrics_every(Duration::from_secs(1))
        .drain_deadline(drain_deadline);
    if let Some(tls) = tls {
        server = server.tls(tls); // PySpark: sc://HOST:PORT/;use_ssl=true
    }
    if let Some(token) = token {
        server = server.token(token); // PySpark: …;token=TOKEN (over TLS only)
    }
    server.serve(listener, shutdown).await
}
