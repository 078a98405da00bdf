//! The async client streams: [`ReattachingStream`] (rx §6) and the non-reattachable
//! [`ExecuteStream`], thin drivers over [`ReattachCore`].

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::future::{BoxFuture, poll_fn};
use futures::stream::{FusedStream, FuturesUnordered, Stream, StreamExt};

use crate::time::{DeadlineSleep, Timer};
use crate::wire::connect::{ExecutePlanRequest, ExecutePlanResponse, ReleaseExecuteRequest};

use super::config::ClientConfig;
use super::core::{ClientPhase, ClientStats, Command, ReattachCore, ResponseId};
use super::error::{ClientError, ReleaseError, RpcError};
use super::retry::{Jitter, RetryDecision, RetryPolicy, Retrying};
use super::rpc::ExecutionRpc;

/// Counters of the release RPCs a stream sent (the fire-and-forget `ReleaseExecute`s of
/// rx §6.3; shared with its background release tasks, so they keep counting after the
/// stream is dropped).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ReleaseStats {
    /// `ReleaseUntil` RPC calls made, retries included.
    pub until_calls: u64,
    /// `ReleaseAll` RPC calls made, retries included.
    pub all_calls: u64,
    /// Releases that ended in success.
    pub succeeded: u64,
    /// Releases that ended in failure after their retries (logged; the server's abandonment
    /// cleans up).
    pub failed: u64,
    /// `ReleaseUntil`s folded into a newer one because
    /// [`ClientConfig::max_releases_in_flight`] were in flight.
    pub coalesced: u64,
}

#[derive(Default)]
struct Counters {
    until_calls: AtomicU64,
    all_calls: AtomicU64,
    succeeded: AtomicU64,
    failed: AtomicU64,
    coalesced: AtomicU64,
}

/// The release lane of one stream: bounds release RPCs in flight, coalesces `ReleaseUntil`s
/// beyond the bound, and lets `close` wait until every release has finished.
#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
    counters: Counters,
}

#[derive(Default)]
struct LaneState {
    in_flight: usize,
    /// The newest `ReleaseUntil` waiting for a free slot.
    coalesced: Option<ReleaseExecuteRequest>,
    idle: Vec<Waker>,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, LaneState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stats(&self) -> ReleaseStats {
        let c = &self.counters;
        ReleaseStats {
            until_calls: c.until_calls.load(Ordering::Relaxed),
            all_calls: c.all_calls.load(Ordering::Relaxed),
            succeeded: c.succeeded.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
        }
    }

    fn poll_idle(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.lock();
        if st.in_flight == 0 {
            Poll::Ready(())
        } else {
            st.idle.push(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A release task finished its request: hands it the coalesced one, or frees its slot.
    fn next_or_finish(&self) -> Option<ReleaseExecuteRequest> {
        let mut st = self.lock();
        if let Some(next) = st.coalesced.take() {
            return Some(next);
        }
        st.in_flight -= 1;
        if st.in_flight == 0 {
            std::mem::take(&mut st.idle)
                .into_iter()
                .for_each(Waker::wake);
        }
        None
    }
}

fn is_release_all(req: &ReleaseExecuteRequest) -> bool {
    matches!(
        req.release,
        Some(crate::wire::connect::release_execute_request::Release::ReleaseAll(_))
    )
}

/// Sends release RPCs without blocking delivery: spawned on the tokio runtime when there is
/// one (feature `tokio`), else pipelined — polled by the stream's own `poll_next`.
struct Releaser<R: ExecutionRpc + ?Sized> {
    rpc: Arc<R>,
    lane: Arc<Lane>,
    inline: FuturesUnordered<BoxFuture<'static, ()>>,
    policies: Arc<[RetryPolicy]>,
    timer: Arc<dyn Timer>,
    jitter: Jitter,
    cap: usize,
}

impl<R: ExecutionRpc + ?Sized> Releaser<R> {
    fn dispatch(&mut self, req: ReleaseExecuteRequest) {
        {
            let mut st = self.lane.lock();
            if is_release_all(&req) {
                st.coalesced = None;
            } else if st.in_flight >= self.cap {
                if st.coalesced.replace(req).is_some() {
                    self.lane.counters.coalesced.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            st.in_flight += 1;
        }
        // The RPC is started here, in delivery order; retries run in the task.
        let first = start_release(&*self.rpc, &self.lane, req.clone());
        let task = release_task(
            self.rpc.clone(),
            self.lane.clone(),
            self.policies.clone(),
            self.timer.clone(),
            self.jitter.next_u64(),
            req,
            first,
        );
        self.spawn(task);
    }

    fn spawn(&mut self, task: BoxFuture<'static, ()>) {
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(task);
            return;
        }
        self.inline.push(task);
    }

    fn poll_inline(&mut self, cx: &mut Context<'_>) {
        while let Poll::Ready(Some(())) = self.inline.poll_next_unpin(cx) {}
    }
}

fn start_release<R: ExecutionRpc + ?Sized>(
    rpc: &R,
    lane: &Lane,
    req: ReleaseExecuteRequest,
) -> BoxFuture<'static, Result<crate::wire::connect::ReleaseExecuteResponse, RpcError>> {
    let counter = if is_release_all(&req) {
        &lane.counters.all_calls
    } else {
        &lane.counters.until_calls
    };
    counter.fetch_add(1, Ordering::Relaxed);
    rpc.release_execute(req)
}

/// One release slot: the request with Spark's retry loop (rx §6.3: failures are retried,
/// then only logged), then any coalesced request.
fn release_task<R: ExecutionRpc + ?Sized>(
    rpc: Arc<R>,
    lane: Arc<Lane>,
    policies: Arc<[RetryPolicy]>,
    timer: Arc<dyn Timer>,
    seed: u64,
    mut req: ReleaseExecuteRequest,
    mut call: BoxFuture<'static, Result<crate::wire::connect::ReleaseExecuteResponse, RpcError>>,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let mut jitter = Jitter::new(Some(seed));
        loop {
            let mut retrying = Retrying::new(policies.clone());
            loop {
                match call.await {
                    Ok(_) => {
                        lane.counters.succeeded.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(error) => match retrying.on_error(&error, jitter.unit()) {
                        RetryDecision::Retry(wait) => {
                            if timer.fires() {
                                let until = crate::time::deadline_after(timer.now(), wait);
                                timer.sleep_until(until).await;
                            }
                            call = start_release(&*rpc, &lane, req.clone());
                        }
                        RetryDecision::NotRetryable | RetryDecision::Exhausted => {
                            tracing::debug!(
                                operation_id = %req.operation_id,
                                %error,
                                "ReleaseExecute failed; the server's abandonment will clean up"
                            );
                            lane.counters.failed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    },
                }
            }
            match lane.next_or_finish() {
                Some(next) => {
                    req = next;
                    call = start_release(&*rpc, &lane, req.clone());
                }
                None => break,
            }
        }
    })
}

/// The async driver shared by both stream forms.
struct Driver<R: ExecutionRpc + ?Sized> {
    core: ReattachCore,
    rpc: Arc<R>,
    timer: Arc<dyn Timer>,
    opening: Option<BoxFuture<'static, Result<R::Stream, RpcError>>>,
    current: Option<Pin<Box<R::Stream>>>,
    /// The one sleep, armed for the core's [`poll_timeout`](ReattachCore::poll_timeout)
    /// (the RPC deadline or the end of a backoff).
    timeout: DeadlineSleep,
    releases: Releaser<R>,
}

impl<R: ExecutionRpc + ?Sized> Driver<R> {
    fn new(core: ReattachCore, rpc: Arc<R>, config: &ClientConfig) -> Self {
        let releases = Releaser {
            rpc: rpc.clone(),
            lane: Arc::new(Lane::default()),
            inline: FuturesUnordered::new(),
            policies: Arc::from(config.retry_policies.clone()),
            timer: config.timer.clone(),
            jitter: Jitter::new(config.jitter_seed.map(|s| s ^ 0x5eed)),
            cap: config.max_releases_in_flight.max(1),
        };
        Self {
            core,
            rpc,
            timer: config.timer.clone(),
            opening: None,
            current: None,
            timeout: DeadlineSleep::default(),
            releases,
        }
    }

    /// Drops the RPC when the core no longer expects it (completed, failed, retrying, its
    /// deadline passed).
    fn sync_rpc(&mut self) {
        if self.core.phase() != ClientPhase::Attached {
            self.opening = None;
            self.current = None;
        }
    }

    /// Sleeps until the core's next deadline; when it has passed, hands the time to the core
    /// ([`ReattachCore::handle_timeout`]) and returns `true` (the caller polls again). On a
    /// timer that never fires ([`NoTimeouts`](crate::time::NoTimeouts)) no RPC deadline is
    /// armed and a backoff is not waited for: its end is handed over at once.
    fn poll_timeout(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(at) = self.core.poll_timeout() else {
            self.timeout.clear();
            return false;
        };
        if !self.timer.fires() {
            if self.core.phase() != ClientPhase::Backoff {
                return false;
            }
            self.core.handle_timeout(at);
            self.sync_rpc();
            return true;
        }
        match self.timeout.poll_until(&*self.timer, at, cx) {
            Poll::Ready(now) => {
                self.core.handle_timeout(now);
                self.sync_rpc();
                true
            }
            Poll::Pending => false,
        }
    }

    fn flush_releases(&mut self, cx: &mut Context<'_>) {
        while let Some(req) = self.core.poll_release() {
            self.releases.dispatch(req);
        }
        self.releases.poll_inline(cx);
    }

    fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ExecutePlanResponse, ClientError>>> {
        self.releases.poll_inline(cx);
        let out = loop {
            if let Some(open) = self.opening.as_mut() {
                match open.as_mut().poll(cx) {
                    Poll::Ready(Ok(stream)) => {
                        self.opening = None;
                        self.current = Some(Box::pin(stream));
                    }
                    Poll::Ready(Err(e)) => {
                        self.opening = None;
                        let now = self.timer.now();
                        self.core.on_error(e, now);
                        self.sync_rpc();
                    }
                    Poll::Pending => {
                        if !self.poll_timeout(cx) {
                            break Poll::Pending;
                        }
                    }
                }
                continue;
            }
            if let Some(stream) = self.current.as_mut() {
                match stream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(resp))) => {
                        let delivered = self.core.on_response(resp);
                        self.sync_rpc();
                        if let Some(resp) = delivered {
                            break Poll::Ready(Some(Ok(resp)));
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.current = None;
                        let now = self.timer.now();
                        self.core.on_error(e, now);
                        self.sync_rpc();
                    }
                    Poll::Ready(None) => {
                        self.current = None;
                        self.core.on_stream_end();
                        self.sync_rpc();
                    }
                    Poll::Pending => {
                        if !self.poll_timeout(cx) {
                            break Poll::Pending;
                        }
                    }
                }
                continue;
            }
            match self.core.poll_command(self.timer.now()) {
                Command::ExecutePlan(req) => self.opening = Some(self.rpc.execute_plan(req)),
                Command::ReattachExecute(req) => {
                    self.opening = Some(self.rpc.reattach_execute(req));
                }
                Command::Read => {
                    // Attached without an RPC cannot happen: every command that attaches
                    // stores its RPC. Recover as if the stream had ended.
                    debug_assert!(false, "core attached without an RPC");
                    self.core.on_stream_end();
                }
                Command::Sleep(_) => {
                    if !self.poll_timeout(cx) {
                        break Poll::Pending;
                    }
                }
                Command::Fail(e) => break Poll::Ready(Some(Err(e))),
                Command::Done => break Poll::Ready(None),
            }
        };
        self.flush_releases(cx);
        out
    }

    fn close_now(&mut self) {
        self.core.close();
        self.sync_rpc();
        self.timeout.clear();
        while let Some(req) = self.core.poll_release() {
            self.releases.dispatch(req);
        }
    }

    async fn close(&mut self) -> ReleaseStats {
        self.close_now();
        let releases = &mut self.releases;
        poll_fn(|cx| {
            releases.poll_inline(cx);
            releases.lane.poll_idle(cx)
        })
        .await;
        self.releases.lane.stats()
    }
}

impl<R: ExecutionRpc + ?Sized> Drop for Driver<R> {
    fn drop(&mut self) {
        self.close_now();
        if self.releases.inline.is_empty() {
            return;
        }
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            for task in std::mem::take(&mut self.releases.inline) {
                rt.spawn(task);
            }
            return;
        }
        tracing::debug!(
            operation_id = %self.core.operation_id(),
            pending = self.releases.inline.len(),
            "stream dropped outside a tokio runtime: pending releases are not sent; the \
             server abandons the execution after its detached timeout"
        );
    }
}

/// A reattachable execution's responses as a [`Stream`], surviving broken and rotated RPCs
/// (Spark's `ExecutePlanResponseReattachableIterator`, rx §6).
///
/// Each item is the next response, delivered exactly once and in order — the final
/// `ResultComplete` response included — or, once, the [`ClientError`] that ended it. Under
/// the hood ([`ReattachCore`] has the rules):
///
/// - The `ExecutePlan` request gets a UUID v4 `operation_id` (unless it has one; it is then
///   canonicalised to lower case) and `reattach_options { reattachable: true }`.
/// - An RPC that ends without `ResultComplete` is followed by `ReattachExecute` naming the
///   last delivered response, in a loop: empty rotations are normal. `last_response_id` is
///   omitted when nothing was delivered, never sent empty.
/// - Errors go through the [`RetryPolicy`] (Spark's `DefaultPolicy` by default: `UNAVAILABLE`
///   and `INVALID_CURSOR.DISCONNECTED` retried with 50 ms × 4 backoff, 15 times; not
///   `DEADLINE_EXCEEDED`), each retry reattaching after its backoff. The retry scope restarts
///   with every delivered response.
/// - `INVALID_HANDLE.OPERATION_NOT_FOUND` / `SESSION_NOT_FOUND` re-sends the same
///   `ExecutePlan` at once if nothing was delivered yet; otherwise the stream fails with
///   [`ClientError::ResponseAlreadyReceived`] rather than duplicate results.
/// - Every response must carry the `server_side_session_id` of the first one
///   ([`ClientError::SessionChanged`]).
/// - After each delivered response a `ReleaseUntil` for it is sent without blocking
///   delivery ([`ReleaseMode::AfterDelivery`](super::ReleaseMode), or by hand with
///   [`release_until`](Self::release_until) in manual mode); exactly one `ReleaseAll` goes
///   out: after `ResultComplete`, on the error, on [`close`](Self::close), or on drop.
///
/// Nothing is sent before the stream is first polled (Rust streams are lazy; Spark's
/// iterator sends `ExecutePlan` at construction).
///
/// # Release RPCs and drop
///
/// Release RPCs are fire-and-forget, with the same retry policy; their failures are only
/// logged (and counted in [`release_stats`](Self::release_stats)). With the `tokio` feature
/// inside a runtime they run as spawned tasks; elsewhere they are pipelined — polled by this
/// stream's own `poll_next` and by [`close`](Self::close). At most
/// [`ClientConfig::max_releases_in_flight`] run at once; further `ReleaseUntil`s are folded
/// into the newest.
///
/// Dropping the stream (also what happens when the consuming task is cancelled) never
/// blocks: inside a tokio runtime the pending releases and the `ReleaseAll` are spawned;
/// without one they are not sent, and the server abandons the detached execution after its
/// `detached_timeout` (5 min, rx §5.3) — call [`close`](Self::close) to release promptly.
///
/// # Cancel safety
///
/// `poll_next` is cancel-safe: a response is handed out only by the poll that returns it, so
/// dropping a `next()` future loses nothing.
///
/// Only the reattachable form has [`release_until`](Self::release_until) and
/// [`last_response_id`](Self::last_response_id):
///
/// ```compile_fail
/// fn no_release<R: tether::execution::client::ExecutionRpc>(
///     s: &mut tether::execution::client::ExecuteStream<R>,
///     id: &tether::execution::client::ResponseId,
/// ) {
///     s.release_until(id);
/// }
/// ```
///
/// [`RetryPolicy`]: super::RetryPolicy
#[must_use = "streams do nothing unless polled"]
pub struct ReattachingStream<R: ExecutionRpc + ?Sized> {
    driver: Driver<R>,
}

impl<R: ExecutionRpc + ?Sized> ReattachingStream<R> {
    /// A reattaching stream of `request`'s results over `rpc`, with the operation id and
    /// reattach option set as Spark's iterator sets them (rx §6.2).
    ///
    /// # Errors
    /// [`ClientError::InvalidOperationId`] when `request.operation_id` is set to something
    /// that is not a UUID (the server would reject it with `INVALID_HANDLE.FORMAT`).
    pub fn new(
        rpc: Arc<R>,
        request: ExecutePlanRequest,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let core = ReattachCore::reattachable(request, &config)?;
        Ok(Self {
            driver: Driver::new(core, rpc, &config),
        })
    }

    /// The operation id on every request (canonical lower-case UUID, rx §6.2).
    pub fn operation_id(&self) -> &str {
        self.driver.core.operation_id()
    }

    /// The `ExecutePlan` request as sent (rx §6.2 `initialRequest`).
    pub fn request(&self) -> &ExecutePlanRequest {
        self.driver.core.request()
    }

    /// The id of the last delivered response, for [`release_until`](Self::release_until)
    /// (rx §6.2 `lastReturnedResponseId`).
    pub fn last_response_id(&self) -> Option<ResponseId> {
        self.driver.core.last_response_id().cloned()
    }

    /// The server-side session id the responses carry (rx §1.3), once seen.
    pub fn server_side_session_id(&self) -> Option<&str> {
        self.driver.core.server_side_session_id()
    }

    /// What the stream did so far (the calls of rx §6.3).
    pub fn stats(&self) -> ClientStats {
        self.driver.core.stats()
    }

    /// What the release RPCs did so far (including ones still running in the background;
    /// rx §6.3: failures are only logged).
    pub fn release_stats(&self) -> ReleaseStats {
        self.driver.releases.lane.stats()
    }

    /// Whether the stream has ended (its last item was `ResultComplete` or an error, or it
    /// was closed; rx §6.3 `has_next()` is false).
    pub fn is_finished(&self) -> bool {
        self.driver.core.is_finished()
    }

    /// Tells the server the caller is done with every response up to and including `id`
    /// (`ReleaseUntil`, rx §1.5), without waiting for the RPC. Only in
    /// [`ReleaseMode::Manual`](super::ReleaseMode::Manual). Ids older than one already
    /// released, and anything after `ReleaseAll`, are skipped.
    ///
    /// # Errors
    /// [`ReleaseError::ForeignResponseId`] for an id another stream delivered;
    /// [`ReleaseError::AutomaticMode`] in [`ReleaseMode::AfterDelivery`](super::ReleaseMode).
    pub fn release_until(&mut self, id: &ResponseId) -> Result<(), ReleaseError> {
        self.driver.core.release_until(id)?;
        while let Some(req) = self.driver.core.poll_release() {
            self.driver.releases.dispatch(req);
        }
        Ok(())
    }

    /// Ends the stream (Spark's `close()` ⇒ `release_all()`, rx §6.3): sends the one
    /// `ReleaseAll` unless it was already sent, and waits until every release RPC of this
    /// stream (retries included) has finished. Returns the final release counters.
    /// Cancel-safe: dropping the future mid-way leaves the releases to the drop path.
    pub async fn close(mut self) -> ReleaseStats {
        self.driver.close().await
    }
}

impl<R: ExecutionRpc + ?Sized> Stream for ReattachingStream<R> {
    type Item = Result<ExecutePlanResponse, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().driver.poll_next(cx)
    }
}

impl<R: ExecutionRpc + ?Sized> FusedStream for ReattachingStream<R> {
    fn is_terminated(&self) -> bool {
        self.driver.core.is_terminated()
    }
}

impl<R: ExecutionRpc + ?Sized> fmt::Debug for ReattachingStream<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReattachingStream")
            .field("operation_id", &self.operation_id())
            .field("phase", &self.driver.core.phase())
            .field("last_response_id", &self.driver.core.last_response_id())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// A non-reattachable execution's responses as a [`Stream`]: plain `ExecutePlan`, whose
/// end of stream is the end of the result.
///
/// It has no reattach and no release: the server removes a non-reattachable execution when
/// its one RPC ends (rx §2.2 T14). Retryable errors (per the [`RetryPolicy`]) before the
/// first response re-send the same `ExecutePlan` after the backoff, as Spark's Scala client
/// does; after a response any error is final, since the stream cannot resume (rx §6.3).
/// Against a 4.3 server a re-send whose first attempt did reach it is refused, finally
/// too: the same plan under a live operation id is a reattach, which a non-reattachable
/// execution answers with `INVALID_CURSOR.NOT_REATTACHABLE`; once it ended, the id gets
/// `OPERATION_ABANDONED` (rx §5.2; before 4.0.1, `OPERATION_ALREADY_EXISTS`).
///
/// [`RetryPolicy`]: super::RetryPolicy
#[must_use = "streams do nothing unless polled"]
pub struct ExecuteStream<R: ExecutionRpc + ?Sized> {
    driver: Driver<R>,
}

impl<R: ExecutionRpc + ?Sized> ExecuteStream<R> {
    /// A stream of `request`'s results over `rpc`; any reattach option is removed from the
    /// request (the non-reattachable path of rx §6.3).
    ///
    /// # Errors
    /// [`ClientError::InvalidOperationId`] when `request.operation_id` is set to something
    /// that is not a UUID.
    pub fn new(
        rpc: Arc<R>,
        request: ExecutePlanRequest,
        config: ClientConfig,
    ) -> Result<Self, ClientError> {
        let core = ReattachCore::non_reattachable(request, &config)?;
        Ok(Self {
            driver: Driver::new(core, rpc, &config),
        })
    }

    /// The operation id on the request (canonical lower-case UUID, rx §1.9: kept if set,
    /// else a fresh UUID v4, as Spark's clients do since SPARK-58547).
    pub fn operation_id(&self) -> &str {
        self.driver.core.operation_id()
    }

    /// The `ExecutePlan` request as sent (rx §1.2).
    pub fn request(&self) -> &ExecutePlanRequest {
        self.driver.core.request()
    }

    /// What the stream did so far (`ExecutePlan` calls and retries, rx §6.3).
    pub fn stats(&self) -> ClientStats {
        self.driver.core.stats()
    }

    /// Whether the stream has ended (its plain end is the result's end, rx §1.3).
    pub fn is_finished(&self) -> bool {
        self.driver.core.is_finished()
    }
}

impl<R: ExecutionRpc + ?Sized> Stream for ExecuteStream<R> {
    type Item = Result<ExecutePlanResponse, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().driver.poll_next(cx)
    }
}

impl<R: ExecutionRpc + ?Sized> FusedStream for ExecuteStream<R> {
    fn is_terminated(&self) -> bool {
        self.driver.core.is_terminated()
    }
}

impl<R: ExecutionRpc + ?Sized> fmt::Debug for ExecuteStream<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecuteStream")
            .field("operation_id", &self.operation_id())
            .field("phase", &self.driver.core.phase())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
