//! What tether tells an operator: typed lifecycle events through a bounded channel, metrics
//! through the [`metrics`] facade, and `tracing` spans.
//!
//! # Events
//!
//! Each protocol side publishes its lifecycle as typed events:
//! [`ExecutionEvent`](crate::execution::ExecutionEvent)s from an
//! [`ExecutionManager`](crate::execution::ExecutionManager) (Spark Connect's session and
//! operation listener events, and those only tether knows: reattaches, rotations,
//! releases, abandonment, tombstone hits, producers waiting on the memory budget), and
//! [`WorkerEvent`](crate::worker::WorkerEvent)s from worker sessions (created,
//! initialized, terminated with their `Termination`, udf §4.1) and from the worker
//! processes a dispatcher runs (spawned, ready, reused, invalidated, stopped, udf §6). They
//! go through an [`EventSender`] the application hands in (for the manager,
//! [`ManagerConfig::events`](crate::execution::ManagerConfig::events); for a session made
//! with `Session::new`, [`SessionConfig::events`](crate::worker::engine::SessionConfig::events);
//! for a dispatcher's worker processes and sessions, `DispatcherConfig::events`, feature
//! `tokio`) and are read from the matching [`EventReceiver`], on the application's own task
//! or thread.
//!
//! The channel is bounded and never blocks the protocol: sending is one push into a
//! fixed ring (no lock, no allocation); when the ring is full the event is dropped, counted
//! ([`EventReceiver::dropped`], [`EventSender::dropped`]) and reported in the metric
//! `tether_events_dropped_total`, never lost silently. Once the [`EventReceiver`] is
//! dropped nobody listens: events are discarded uncounted ([`EventSender::is_listened`]
//! says so), as Spark's listener bus discards posts after its queue stopped. A listener
//! that can fail (a log file on a full disk) should keep its receiver and keep reading,
//! counting what it could not keep, rather than drop it: `examples/connect_server`'s
//! `--events-log` does. A listener that keeps up sees every
//! event, in the order the protocol decided it (per execution and per session, the order of
//! Spark's status machine, [`OperationStatus`](crate::execution::OperationStatus); per
//! worker session, the udf §4.1 states its `EngineCore` reached; per worker process, the
//! order of the dispatcher's decisions).
//!
//! # Metrics
//!
//! tether records through the [`metrics`] facade: install a recorder (an exporter such as
//! `metrics-exporter-prometheus`) **before** building the manager or the worker dispatcher,
//! which register their handles once, so that no protocol path looks a metric up or
//! allocates for one (the `tether_udf_` metrics are a dispatcher's, for its workers and
//! sessions; a session made with `Session::new` reports events only). Without a
//! recorder every update is a no-op. Both sides count on their own memory (one relaxed
//! atomic add per event) and hand their series to the recorder at their own points. An
//! execution manager does so, and samples its gauges, at each maintenance pass
//! (`ManagerConfig::maintenance_interval`, 30 s by default;
//! `ExecutionManager::publish_metrics` does it on demand), so that a request pays nothing for
//! a gauge and makes no call into the recorder. A dispatcher does so right after each event
//! (its events are per worker process and per session, so the recorder sees each at once).
//! Histograms are bucketed on the side's own memory the same way (32 log-linear buckets per
//! power of two of nanoseconds) and handed over as samples of each bucket's midpoint, within
//! 1.6 % of the value recorded.
//! Names follow Prometheus conventions; no label is unbounded (no ids: those are in the
//! events and spans). Each name is written once in the library, in its side's table of
//! metrics; a standing check (`tests/checks`) holds the table below to those.
//!
//! # Spans and logs
//!
//! tether logs through `tracing`, inside spans that carry the ids, so that an application's
//! subscriber can filter and correlate: each Spark Connect RPC runs in a `spark_connect_rpc`
//! span (`rpc`, `user_id`, `session_id`, `operation_id`), each execution's producer in a
//! `spark_connect_execution` span (the same ids), and each worker session in a `udf_session`
//! span (`session`, `worker`). What a Spark Connect server logs, and at which level (Spark's
//! `ErrorUtils.handleError` logs every error answered to a client at ERROR; tether keeps
//! ERROR for the server's own failures, so that an operator can alert on it):
//!
//! | what | level | message | fields |
//! |---|---|---|---|
//! | an RPC's refusal with a Spark condition (the client's mistake or race: an unknown operation, a closed session, a configuration key the server lacks) | INFO | `Spark Connect RPC error` | `condition`, `error` |
//! | an RPC's retryable refusal (`UNAVAILABLE`, as while draining) | INFO | `Spark Connect RPC error` | `condition`, `error` |
//! | any other error of an RPC (a failure in the server) | ERROR | `Spark Connect RPC error` | `condition`, `error` |
//! | an execution's error on its response stream (the user's query failed or was canceled) | INFO | `Spark Connect error on a response stream` | `condition`, `error` |
//! | a request refused before the service: a wrong or missing token, no client certificate where one is required | WARN | `Spark Connect request refused` | `peer`, `why` |
//! | each RPC's outcome | DEBUG | | |
//!
//! `condition` is the Spark condition: tether's own, else the engine's (which
//! `tether_connect_errors_total` counts as `OTHER`), else `OTHER`.
//!
//! # The metrics
//!
//! Every metric either side records (see [Metrics](#metrics); the `tether_connect_` ones are
//! an execution manager's, the `tether_udf_` ones a dispatcher's):
//!
//! | name | type | unit | labels | what |
//! |---|---|---|---|---|
//! | `tether_connect_sessions` | gauge | sessions | | live sessions (rx §5.6; sampled at each maintenance pass) |
//! | `tether_connect_sessions_started_total` | counter | sessions | | sessions created |
//! | `tether_connect_sessions_closed_total` | counter | sessions | | sessions released or expired (rx §5.6) |
//! | `tether_connect_executions` | gauge | executions | | live (registered) executions (rx §5.1; sampled at each maintenance pass) |
//! | `tether_connect_executions_started_total` | counter | executions | | executions registered (`OperationStarted`) |
//! | `tether_connect_executions_ended_total` | counter | executions | `status`: `finished`, `failed`, `canceled` | executions whose run ended (rx §2.2 T7–T9) |
//! | `tether_connect_executions_closed_total` | counter | executions | `removal`: `released` (fault-injection forgets included), `abandoned` (detached past the detached timeout, or still registered when their session was released or expired, as Spark's `removeAllExecutionsForSession` abandons them: PySpark's `spark.stop()` can overtake its own last ReleaseAll) | executions that left the registry (`OperationClosed`, rx §2.2 T12) |
//! | `tether_connect_attached_streams` | gauge | streams | | response streams attached (rx §4.4; sampled at each maintenance pass) |
//! | `tether_connect_reattaches_total` | counter | reattaches | | ReattachExecute (and duplicate ExecutePlan) attaches (rx §5.5) |
//! | `tether_connect_replayed_responses_total` | counter | responses | | responses a reattach resumed before the last one an earlier stream sent (rx §3.5) |
//! | `tether_connect_stream_rotations_total` | counter | streams | `reason`: `duration`, `bytes` | streams ended gracefully for rotation (rx §4.2) |
//! | `tether_connect_releases_total` | counter | requests | `kind`: `until`, `all` | ReleaseExecute applied (rx §3.4, §5.5) |
//! | `tether_connect_tombstone_hits_total` | counter | requests | | requests refused by an abandoned-operation tombstone (rx §5.4) |
//! | `tether_connect_errors_total` | counter | errors | `condition`: a Spark condition of [`condition::ALL`](crate::execution::condition::ALL), or `OTHER` | errors answered to a client, by RPC or on a response stream (rx §1.8) |
//! | `tether_connect_memory_budget_used_bytes` | gauge | bytes | | the shared memory budget in use (unsent and retained responses) |
//! | `tether_connect_memory_budget_waiting_producers` | gauge | producers | | producers waiting for the memory budget |
//! | `tether_connect_producer_waits_total` | counter | waits | | times a producer waited for the memory budget |
//! | `tether_connect_unsent_bytes` | gauge | bytes | | responses produced and not yet sent, all executions (rx §3.1; sampled at each maintenance pass) |
//! | `tether_connect_retained_bytes` | gauge | bytes | | responses sent and kept for a reattach, all executions (rx §3.1; sampled at each maintenance pass) |
//! | `tether_connect_execution_seconds` | histogram | seconds | | from `OperationStarted` to the run's end (Finished, Failed, Canceled) |
//! | `tether_connect_reattach_gap_seconds` | histogram | seconds | | how long an execution was detached before a reattach resumed it |
//! | `tether_connect_admission_running` | gauge | executions | | executions holding an admission slot, when `ManagerConfig::admission` caps them (sampled at each maintenance pass) |
//! | `tether_connect_admission_waiting` | gauge | executions | | executions waiting for an admission slot (sampled at each maintenance pass) |
//! | `tether_connect_admission_waited_total` | counter | executions | | executions that had to wait for a slot |
//! | `tether_connect_admission_refused_total` | counter | executions | `reason`: `timeout` (`SERVER_BUSY`), `draining` (`SERVER_DRAINING`) | waiting executions refused |
//! | `tether_connect_artifact_bytes` | gauge | bytes | | bytes of artifacts the sessions keep (connect §9; a Spark Connect service's, sampled and published at each `ConnectService::sweep_artifacts`, which `ConnectServer` runs every maintenance interval) |
//! | `tether_connect_artifact_uploads_refused_total` | counter | uploads | `reason`: `name`, `exists`, `hash`, `limit`, `protocol` | `AddArtifacts` streams refused (connect §9.3; published with the above) |
//! | `tether_events_dropped_total` | counter | events | `side`: `connect`, `udf` | events a full channel dropped |
//! | `tether_udf_sessions` | gauge | sessions | | live worker sessions: created and not yet terminated (udf §4.1) |
//! | `tether_udf_sessions_total` | counter | sessions | `termination`: `finished`, `cancelled`, `failed`, `transport_failed`, `interrupted` | worker sessions ended, by their [`TerminationKind`](crate::worker::engine::TerminationKind) (udf §4.1) |
//! | `tether_udf_workers` | gauge | workers | | worker processes spawned and not yet stopped (udf §6.1) |
//! | `tether_udf_idle_workers` | gauge | workers | | the pool's size: idle workers waiting for reuse (udf §6.6) |
//! | `tether_udf_workers_spawned_total` | counter | workers | | worker processes started (udf §6.2 step 4) |
//! | `tether_udf_workers_reused_total` | counter | sessions | | sessions given an idle pooled worker instead of a new process (udf §6.6) |
//! | `tether_udf_workers_invalidated_total` | counter | workers | `reason`: `transport_failed`, `interrupted`, `open_failed`, `exited`, `inactive`, `marked` | workers judged unsafe to reuse ([`InvalidationReason`](crate::worker::InvalidationReason), udf §6.5) |
//! | `tether_udf_workers_stopped_total` | counter | workers | `reason`: `released`, `invalid`, `idle_timeout`, `start_failed`, `closed` | worker processes stopped and reaped ([`StopReason`](crate::worker::StopReason), udf §6.1) |
//! | `tether_udf_worker_startup_seconds` | histogram | seconds | | from a worker's spawn to its readiness (udf §6.4) |

mod channel;
mod metric;

pub use channel::{EventReceiver, EventSender, event_channel};
#[cfg(test)]
pub(crate) use metric::described_and_registered;
pub(crate) use metric::{
    EVENTS_DROPPED, LocalCounter, LocalGauge, LocalHistogram, Metric, PublishLock, describe,
};
