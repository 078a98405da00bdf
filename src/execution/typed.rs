//! Typed handles on registered executions: [`Execution<S, K>`](Execution) (rx §2.3).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::Poll;

use futures::future::poll_fn;

use super::core::{ExecutionPhase, RunOutcome};
use super::error::ConnectError;
use super::keys::ExecuteKey;
use super::status::Removal;
use super::stream::{ExecShared, Producer, ResponseStream, Wakes};

mod sealed_kind {
    /// Seals [`Kind`](super::Kind) to the two kinds of execution rx §1.2 defines
    /// (`reattach_options.reattachable` set or not).
    pub trait Sealed {}
}

/// Whether an [`Execution`] is reattachable (rx §1.2; Spark's `ExecuteHolder.reattachable`).
/// Sealed: [`Reattachable`] or [`NonReattachable`].
pub trait Kind: sealed_kind::Sealed + Send + Sync + 'static {
    /// `true` for [`Reattachable`].
    const REATTACHABLE: bool;
}

/// Marker: the execution was started with `reattachable = true` (rx §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reattachable;

/// Marker: the execution is not reattachable (no reattach option, or the server disabled
/// reattach, rx §1.2): one stream, no reattach, no release API; it is removed when its
/// stream ends (rx §2.2 T14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NonReattachable;

impl sealed_kind::Sealed for Reattachable {}
impl sealed_kind::Sealed for NonReattachable {}
impl Kind for Reattachable {
    const REATTACHABLE: bool = true;
}
impl Kind for NonReattachable {
    const REATTACHABLE: bool = false;
}

use super::state::{self, State as _};

/// The final outcome of a [`state::Terminated`] execution: how its runner ended and how it
/// left the registry (rx §2.1 dimensions 3 and 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionOutcome {
    /// How the producer ended (rx §2.1 dimension 3).
    pub run: RunOutcome,
    /// How the execution left the registry: released or abandoned (rx §2.1 dimension 1).
    pub removal: Removal,
}

/// A typed handle on one registered execution (Spark's `ExecuteHolder`), in the lifecycle
/// states of rx §2.3.
///
/// `S` is the state the holder has driven the execution to, `K` whether it is reattachable:
///
#[doc = include_str!("../../docs/diagrams/execution.md")]
///
/// - A [`NonReattachable`] execution has no `reattach`, `release_until` or `release_all`
///   at all; it is released when its single stream ends (rx §2.2 T14).
/// - Transitions consume the handle; [`state::Terminated`] offers only inspection.
/// - The typestate records what *this handle* did. Other parties act on the same execution
///   concurrently through RPCs (a client's ReleaseAll, an Interrupt, abandonment), so
///   [`phase`](Execution::phase) reports the live state and
///   [`into_any`](Execution::into_any) re-reads it into the matching typestate
///   ([`AnyExecution`], the erased form, convertible back with `TryFrom`).
/// - Dropping an [`state::Init`] handle obtained from
///   [`ExecutionManager::execute_plan`](super::ExecutionManager::execute_plan) without
///   starting it removes the execution (rx §2.2 T2: the client must not reattach).
///   Dropping any other handle changes nothing: the execution lives in the manager.
#[must_use = "an execution handle records its protocol state; drop it explicitly if unused"]
pub struct Execution<S: state::State, K: Kind> {
    h: Handle,
    _state: PhantomData<fn() -> (S, K)>,
}

/// The execution a typed handle drives, and whether dropping it unstarted removes it
/// (rx §2.2 T2). A field of its own so that a transition moves it into the next
/// typestate as it is (no reference-count traffic on the shared execution).
struct Handle {
    exec: Arc<ExecShared>,
    remove_if_unstarted: bool,
}

impl<S: state::State, K: Kind> fmt::Debug for Execution<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Execution")
            .field("state", &S::NAME)
            .field("reattachable", &K::REATTACHABLE)
            .field("operation_id", &self.h.exec.operation_id)
            .field("phase", &self.phase())
            .finish()
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.remove_if_unstarted {
            let unstarted = self.exec.lock().core.runner() == super::core::RunnerState::NotStarted;
            if unstarted {
                self.exec.leave(Removal::Released);
            }
        }
    }
}

impl<S: state::State, K: Kind> Execution<S, K> {
    fn from_arc(exec: Arc<ExecShared>) -> Self {
        Self {
            h: Handle {
                exec,
                remove_if_unstarted: false,
            },
            _state: PhantomData,
        }
    }

    fn into_state<T: state::State>(mut self) -> Execution<T, K> {
        self.h.remove_if_unstarted = false;
        Execution {
            h: self.h,
            _state: PhantomData,
        }
    }

    /// The canonical (lower-case) operation id (rx §1.9), as stamped on every response
    /// (rx §1.3).
    pub fn operation_id(&self) -> &str {
        &self.h.exec.operation_id
    }

    /// The shared execution behind this handle (for the manager's tests of rx §2.2
    /// removals).
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &Arc<ExecShared> {
        &self.h.exec
    }

    /// The execution's key `(user_id, session_id, operation_id)` (Spark's `ExecuteKey`,
    /// rx §5.1).
    pub fn key(&self) -> &ExecuteKey {
        &self.h.exec.key
    }

    /// The execution's tags, from `ExecutePlanRequest.tags` (rx §1.2), matched by
    /// `Interrupt(TAG)` (rx §5.7).
    pub fn tags(&self) -> &[String] {
        &self.h.exec.tags
    }

    /// The live phase (rx §2.3), which may have moved on since this handle's typestate (see
    /// [`Execution`]).
    pub fn phase(&self) -> ExecutionPhase {
        self.h.exec.lock().core.phase()
    }

    /// Bytes currently kept for backtracking (the retry buffer, rx §3.4).
    pub fn retained_bytes(&self) -> u64 {
        self.h.exec.lock().core.log().retained_bytes()
    }

    /// Bytes produced but not yet handed to a consumer (tether's unsent bound limits them;
    /// Spark's observer does not, rx §3.2).
    pub fn unsent_bytes(&self) -> u64 {
        self.h.exec.lock().core.log().unsent_bytes()
    }

    /// Re-reads the live phase (rx §2.3) into the matching typestate.
    pub fn into_any(self) -> AnyExecution<K> {
        let phase = self.phase();
        AnyExecution::from_phase(self.into_state::<state::Init>(), phase)
    }
}

impl<K: Kind> Execution<state::Init, K> {
    pub(crate) fn new_submitted(exec: Arc<ExecShared>) -> Self {
        Self {
            h: Handle {
                exec,
                remove_if_unstarted: true,
            },
            _state: PhantomData,
        }
    }

    /// Starts the producer and attaches the initial ExecutePlan stream (rx §2.2 T1):
    /// returns the handle, the [`Producer`] to run the plan with, and the stream to send.
    /// If an interrupt won the race, the producer is told to stop at once and the stream
    /// delivers `OPERATION_CANCELED`.
    pub fn start(self) -> (Execution<state::Streaming, K>, Producer, ResponseStream) {
        let now = self.h.exec.now();
        let id = {
            let mut st = self.h.exec.lock();
            let _ = st.core.start();
            st.core.attach(1, now).0
        };
        let stream = ResponseStream::new(self.h.exec.clone(), id);
        let producer = Producer::new(self.h.exec.clone());
        (self.into_state(), producer, stream)
    }

    /// Abandons the submission before starting it: runner `notStarted → interrupted`
    /// (rx §2.1), and the execution is removed without a tombstone, like a failed start
    /// (rx §2.2 T2).
    pub fn interrupt(self) -> Execution<state::Terminated, K> {
        let mut wakes = Wakes::default();
        {
            let mut st = self.h.exec.lock();
            let _ = st.core.interrupt();
            st.take_all(&mut wakes);
        }
        wakes.wake();
        self.h.exec.leave(Removal::Released);
        self.into_state()
    }
}

impl<K: Kind> Execution<state::Streaming, K> {
    /// Interrupts the execution (rx §2.2 T9): its consumers get `OPERATION_CANCELED`
    /// after the earlier responses and the producer is told to stop. If completion had
    /// already started the interrupt is a no-op and the [`state::Finishing`] handle comes
    /// back.
    ///
    /// # Errors
    /// `Err(Execution<state::Finishing, K>)` when the execution had already completed.
    #[allow(clippy::result_large_err)]
    pub fn interrupt(
        self,
    ) -> Result<Execution<state::Cancelling, K>, Execution<state::Finishing, K>> {
        let mut wakes = Wakes::default();
        let changed = {
            let mut st = self.h.exec.lock();
            let changed = st.core.interrupt();
            st.take_all(&mut wakes);
            changed
        };
        wakes.wake();
        if changed || self.phase() == ExecutionPhase::Cancelling {
            Ok(self.into_state())
        } else {
            Err(self.into_state())
        }
    }
}

impl Execution<state::Streaming, Reattachable> {
    /// Attaches a new consumer resuming after `last_response_id` (rx §3.5), preempting
    /// the current one (which gets `DISCONNECTED`).
    ///
    /// # Errors
    /// As [`ExecutionManager::reattach_execute`](super::ExecutionManager::reattach_execute)
    /// from `NOT_REATTACHABLE` on: `POSITION_NOT_FOUND`, `POSITION_NOT_AVAILABLE`, the
    /// orphan error.
    pub fn reattach(&self, last_response_id: Option<&str>) -> Result<ResponseStream, ConnectError> {
        let mut wakes = Wakes::default();
        let r = self
            .h
            .exec
            .attach(last_response_id, self.h.exec.now(), &mut wakes);
        wakes.wake();
        r
    }

    /// `ReleaseUntil(response_id)` (rx §3.4).
    ///
    /// # Errors
    /// `POSITION_NOT_FOUND` for an id this execution never handed out.
    pub fn release_until(&self, response_id: &str) -> Result<(), ConnectError> {
        let mut wakes = Wakes::default();
        let r = {
            let mut st = self.h.exec.lock();
            let r = st.core.release_until(response_id).map(|_| ());
            wakes.push(st.take_producer());
            r
        };
        wakes.wake();
        r
    }

    /// `ReleaseAll` while running (rx §2.2 T10): removes the execution without a
    /// tombstone, interrupts the producer and disconnects the consumer.
    pub fn release_all(self) -> Execution<state::Cancelling, Reattachable> {
        release(&self.h.exec);
        self.into_state()
    }
}

fn release(exec: &Arc<ExecShared>) -> bool {
    exec.leave(Removal::Released)
}

impl Execution<state::Finishing, Reattachable> {
    /// `ReleaseAll` after completion (rx §2.2 T10): removes the execution.
    pub fn release_all(self) -> Execution<state::Terminated, Reattachable> {
        release(&self.h.exec);
        self.into_state()
    }
}

impl Execution<state::Cancelling, Reattachable> {
    /// `ReleaseAll` after an interrupt (rx §5.7: clients send it once they got
    /// `OPERATION_CANCELED`): removes the execution if still registered (rx §2.2 T10).
    /// Returns whether this call removed it. Always succeeds (unlike Spark 4.3.0 after a
    /// rotation).
    #[must_use]
    pub fn release_all(&self) -> bool {
        release(&self.h.exec)
    }
}

macro_rules! settle {
    ($state:ty) => {
        impl<K: Kind> Execution<$state, K> {
            /// The [`state::Terminated`] handle if the execution is removed and its producer
            /// stopped (rx §2.3 released or abandoned); otherwise this handle back.
            ///
            /// # Errors
            /// `Err(self)` while the execution is still registered or its producer runs.
            #[allow(clippy::result_large_err)]
            pub fn try_terminated(self) -> Result<Execution<state::Terminated, K>, Self> {
                if self.phase() == ExecutionPhase::Terminated {
                    Ok(self.into_state())
                } else {
                    Err(self)
                }
            }

            /// Waits until the execution is removed (released, abandoned, or — for a
            /// non-reattachable one — its stream ended, rx §2.2 T10–T14) and its producer
            /// stopped.
            pub async fn terminated(self) -> Execution<state::Terminated, K> {
                poll_fn(|cx| {
                    let mut st = self.h.exec.lock();
                    if st.core.phase() == ExecutionPhase::Terminated {
                        Poll::Ready(())
                    } else {
                        st.watch(cx.waker());
                        Poll::Pending
                    }
                })
                .await;
                self.into_state()
            }
        }
    };
}

settle!(state::Finishing);
settle!(state::Cancelling);

impl<K: Kind> Execution<state::Terminated, K> {
    /// The final outcome: the runner's end and the removal (rx §2.1 dimensions 3 and 1).
    pub fn outcome(&self) -> ExecutionOutcome {
        let st = self.h.exec.lock();
        ExecutionOutcome {
            // A terminated execution's runner has ended, so the core always has an outcome.
            run: st.core.outcome().unwrap_or(RunOutcome::Cancelled),
            removal: st.core.removal().unwrap_or(Removal::Released),
        }
    }
}

/// The erased form of [`Execution`]: one variant per typestate (the lifecycle states of
/// rx §2.3), for servers that keep handles in maps. Convert back with `TryFrom`.
#[derive(Debug)]
pub enum AnyExecution<K: Kind> {
    /// See [`state::Init`].
    Init(Execution<state::Init, K>),
    /// See [`state::Streaming`].
    Streaming(Execution<state::Streaming, K>),
    /// See [`state::Finishing`].
    Finishing(Execution<state::Finishing, K>),
    /// See [`state::Cancelling`].
    Cancelling(Execution<state::Cancelling, K>),
    /// See [`state::Terminated`].
    Terminated(Execution<state::Terminated, K>),
}

impl<K: Kind> AnyExecution<K> {
    fn from_phase(e: Execution<state::Init, K>, phase: ExecutionPhase) -> Self {
        match phase {
            ExecutionPhase::Init => Self::Init(e),
            ExecutionPhase::Streaming => Self::Streaming(e.into_state()),
            ExecutionPhase::Finishing => Self::Finishing(e.into_state()),
            ExecutionPhase::Cancelling => Self::Cancelling(e.into_state()),
            ExecutionPhase::Terminated => Self::Terminated(e.into_state()),
        }
    }

    /// The typestate's name: `"Init"`, `"Streaming"`, `"Finishing"`, `"Cancelling"` or
    /// `"Terminated"` (rx §2.3).
    pub fn state_name(&self) -> &'static str {
        match self {
            Self::Init(_) => state::Init::NAME,
            Self::Streaming(_) => state::Streaming::NAME,
            Self::Finishing(_) => state::Finishing::NAME,
            Self::Cancelling(_) => state::Cancelling::NAME,
            Self::Terminated(_) => state::Terminated::NAME,
        }
    }

    /// The canonical (lower-case) operation id (rx §1.9).
    pub fn operation_id(&self) -> &str {
        match self {
            Self::Init(e) => e.operation_id(),
            Self::Streaming(e) => e.operation_id(),
            Self::Finishing(e) => e.operation_id(),
            Self::Cancelling(e) => e.operation_id(),
            Self::Terminated(e) => e.operation_id(),
        }
    }
}

any_state_conversions!(AnyExecution, Execution<K: Kind>: Init, Streaming, Finishing, Cancelling, Terminated);

/// A handle found by [`ExecutionManager::lookup`](super::ExecutionManager::lookup) (Spark's
/// `getExecuteHolder`, rx §5.1), by kind (rx §1.2).
#[derive(Debug)]
pub enum Lookup {
    /// A reattachable execution.
    Reattachable(AnyExecution<Reattachable>),
    /// A non-reattachable execution.
    NonReattachable(AnyExecution<NonReattachable>),
}

impl Lookup {
    pub(crate) fn from_shared(exec: Arc<ExecShared>) -> Self {
        let phase = exec.lock().core.phase();
        if exec.reattachable {
            Self::Reattachable(AnyExecution::from_phase(Execution::from_arc(exec), phase))
        } else {
            Self::NonReattachable(AnyExecution::from_phase(Execution::from_arc(exec), phase))
        }
    }
}
