//! The standard gRPC health service for a Spark Connect server (connect §7.2), through
//! `tonic-health`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

/// The health of a [`ConnectService`](super::ConnectService) as `grpc.health.v1.Health`
/// reports it (connect §7.2): one status for the empty service name `""` (the server) and
/// for [`SERVICE_NAME`](super::SERVICE_NAME), `SERVING` while the server takes new work.
///
/// Each service has one, from [`ConnectService::health`](super::ConnectService::health).
/// Serve [`service`](Self::service) on the same `tonic::transport::Server` as the Spark
/// Connect service; a drain marks it `NOT_SERVING` with
/// [`set_serving(false)`](Self::set_serving). The health service is not behind the token
/// (probes carry none). Cheap to clone: clones share the statuses.
#[derive(Clone, Debug)]
pub struct ConnectHealth {
    reporter: HealthReporter,
    /// The status both names report, and the lock that keeps their updates in order.
    serving: Arc<tokio::sync::Mutex<bool>>,
    /// The same, readable without waiting.
    now: Arc<AtomicBool>,
}

impl ConnectHealth {
    /// SERVING (connect §7.2); the Spark Connect name is registered by
    /// [`service`](Self::service).
    pub(crate) fn new() -> Self {
        Self {
            reporter: HealthReporter::new(),
            serving: Arc::new(tokio::sync::Mutex::new(true)),
            now: Arc::new(AtomicBool::new(true)),
        }
    }

    /// The `grpc.health.v1.Health` service to add to the server next to the Spark Connect
    /// service (connect §7.2), with `""` and `spark.connect.SparkConnectService` both
    /// reporting the current status (`SERVING` unless
    /// [`set_serving(false)`](Self::set_serving) was called). A name it does not know gets
    /// `NOT_FOUND`.
    pub async fn service(&self) -> HealthServer<HealthService> {
        let serving = self.serving.lock().await;
        self.report(*serving).await;
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    /// Reports `SERVING` (`serving`: the server takes new work) or `NOT_SERVING` for both
    /// names (connect §7.2); `Watch` streams see the change.
    pub async fn set_serving(&self, serving: bool) {
        let mut current = self.serving.lock().await;
        *current = serving;
        self.now.store(serving, Ordering::Release);
        self.report(serving).await;
    }

    /// Whether both names report `SERVING` (connect §7.2).
    pub fn is_serving(&self) -> bool {
        self.now.load(Ordering::Acquire)
    }

    /// `tonic-health`'s reporter behind [`service`](Self::service), for statuses of other
    /// services served on the same port (connect §7.2).
    pub fn reporter(&self) -> &HealthReporter {
        &self.reporter
    }

    async fn report(&self, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", super::SERVICE_NAME] {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
