//! Correlation (connect §13): the `spark-connect-operation-id` header of Spark master's
//! clients (SPARK-58632), `x-request-id` and W3C `traceparent` on the RPC's span, the
//! execution's span and its `OperationStarted` event; an operation-id header naming another
//! operation than the body is logged with both, and the body's id is the one used.
#![cfg(feature = "spark-connect")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tether::execution::client::ExecutionRpc;
use tether::execution::{ExecutionEventKind, ExecutionManager, ManagerConfig};
use tether::observe::event_channel;
use tether::spark::connect::{ConnectClient, ConnectConfig, ConnectService};
use tether_testing::connect::Caller;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::connect_grpc::Counting;

/// One span's name and fields.
type SeenSpan = (String, BTreeMap<String, String>);

/// Every span's fields by span name, and every event's fields, as text.
#[derive(Clone, Default)]
struct Seen {
    spans: Arc<Mutex<Vec<SeenSpan>>>,
    events: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

struct Index(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Seen {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push((attrs.metadata().name().to_owned(), fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(spans.len() - 1));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let Some(Index(i)) = span.extensions().get::<Index>().map(|i| Index(i.0)) else {
            return;
        };
        values.record(&mut Fields(&mut self.spans.lock().unwrap()[i].1));
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().unwrap().push(fields);
    }
}

/// One thread (the default test runtime): the server's tasks run where the subscriber is
/// the default.
#[tokio::test]
async fn correlation_ids_reach_the_spans_and_the_operation_started_event() {
    let seen = Seen::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(seen.clone()));
    let (events, mut received) = event_channel(1024);
    let manager = ExecutionManager::new(ManagerConfig {
        events: Some(events),
        ..ManagerConfig::default()
    });
    let service = ConnectService::new(manager, Counting).into_service(&ConnectConfig::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const HEADER_OP: &str = "11111111-2222-4333-8444-555555555555";
    let client = ConnectClient::connect(&address, None)
        .await
        .unwrap()
        .with_header("x-request-id", "req-42")
        .unwrap()
        .with_header("traceparent", TRACEPARENT)
        .unwrap()
        .with_header("spark-connect-operation-id", HEADER_OP)
        .unwrap();
    let body_op = uuid::Uuid::new_v4().to_string();
    let mut request = Caller::default().plan("2");
    request.operation_id = Some(body_op.clone());
    let responses: Vec<_> = client.execute_plan(request).await.unwrap().collect().await;
    // The body's operation id is the one used.
    assert!(
        responses
            .iter()
            .all(|r| r.as_ref().unwrap().operation_id == body_op)
    );

    let spans = seen.spans.lock().unwrap().clone();
    for name in ["spark_connect_rpc", "spark_connect_execution"] {
        let (_, fields) = spans
            .iter()
            .find(|(n, f)| n == name && f.get("operation_id").is_some_and(|o| o.contains(&body_op)))
            .unwrap_or_else(|| panic!("no {name} span of {body_op}: {spans:?}"));
        assert_eq!(
            fields.get("request_id").map(String::as_str),
            Some("req-42"),
            "{name}: {fields:?}"
        );
        assert_eq!(
            fields.get("traceparent").map(String::as_str),
            Some(TRACEPARENT),
            "{name}: {fields:?}"
        );
        assert_eq!(
            fields.get("operation_id_header").map(String::as_str),
            Some(HEADER_OP),
            "{name}: {fields:?}"
        );
    }
    let warned = seen.events.lock().unwrap().iter().any(|e| {
        e.get("message")
            .is_some_and(|m| m.contains("spark-connect-operation-id header"))
            && e.get("header").map(String::as_str) == Some(HEADER_OP)
            && e.get("body").is_some_and(|b| b.contains(&body_op))
    });
    assert!(
        warned,
        "the mismatch logged with both ids: {:?}",
        seen.events.lock().unwrap()
    );

    let started = received
        .try_recv_all()
        .into_iter()
        .find_map(|e| match e.kind {
            ExecutionEventKind::OperationStarted { correlation, .. } => Some(correlation),
            _ => None,
        })
        .expect("an OperationStarted event");
    assert_eq!(started.request_id.as_deref(), Some("req-42"));
    assert_eq!(started.traceparent.as_deref(), Some(TRACEPARENT));
    assert_eq!(started.operation_id.as_deref(), Some(HEADER_OP));
}
