//! Where an operation stands in Spark's eyes: its status along Spark's status machine
//! ([`OperationStatus`], rx §2.1 item 4), which its [`ExecutionCore`](super::ExecutionCore)
//! enforces and its listener events follow, and how it left the registry ([`Removal`]).

/// Spark's operation status (`ExecuteStatus`, rx §2.1 item 4): the states of the listener
/// events an operation posts, in order `Pending → Started → Analyzed → ReadyForExecution →
/// Finished → Closed`, with `Failed` and `Canceled` as the other ends of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OperationStatus {
    /// Not yet registered.
    Pending,
    /// `SparkListenerConnectOperationStarted`: registered (rx §2.2 T1).
    Started,
    /// `SparkListenerConnectOperationAnalyzed`: the engine analyzed the plan.
    Analyzed,
    /// `SparkListenerConnectOperationReadyForExecution`: the engine is about to execute.
    ReadyForExecution,
    /// `SparkListenerConnectOperationFinished`: the producer finished (rx §2.2 T7), not
    /// when the results were sent (SPARK-45133).
    Finished,
    /// `SparkListenerConnectOperationFailed` (rx §2.2 T8, T15).
    Failed,
    /// `SparkListenerConnectOperationCanceled` (rx §2.2 T9, T12 while running).
    Canceled,
    /// `SparkListenerConnectOperationClosed`: left the registry (rx §2.2 T12).
    Closed,
}

impl OperationStatus {
    /// Whether Spark's status machine allows posting `next` in state `self`
    /// (`ExecuteEventsManager.assertStatus`; rx §2.1 item 4, scenarios rx §7.4 40–44):
    /// Started from Pending; Analyzed from Started or Analyzed; ReadyForExecution from
    /// Analyzed; Finished from Started or ReadyForExecution; Failed from Started, Analyzed,
    /// ReadyForExecution or Finished; Canceled from those and Failed, and from Pending
    /// (SPARK-53339: an execution interrupted or removed before it started); Closed from
    /// Finished, Failed or Canceled.
    pub fn allows(self, next: Self) -> bool {
        use OperationStatus::*;
        match next {
            Pending => false,
            Started => self == Pending,
            Analyzed => matches!(self, Started | Analyzed),
            ReadyForExecution => self == Analyzed,
            Finished => matches!(self, Started | ReadyForExecution),
            Failed => matches!(self, Started | Analyzed | ReadyForExecution | Finished),
            Canceled => matches!(
                self,
                Pending | Started | Analyzed | ReadyForExecution | Finished | Failed
            ),
            Closed => matches!(self, Finished | Failed | Canceled),
        }
    }

    /// Whether the run has ended: Finished, Failed, Canceled or Closed (rx §2.1 item 4).
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            Self::Finished | Self::Failed | Self::Canceled | Self::Closed
        )
    }
}

/// Why Spark's status machine refused an operation event (Spark throws
/// `IllegalStateException` from `ExecuteEventsManager.assertStatus`; rx §7.4 41–44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("operation status {from:?} does not allow the event {to:?} (rx §2.1 item 4)")]
pub struct IllegalTransition {
    /// The status the operation is in.
    pub from: OperationStatus,
    /// The status the refused event would have moved it to.
    pub to: OperationStatus,
}

/// How an execution left the registry (rx §2.1 dimension 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Removal {
    /// ReleaseAll, end of a non-reattachable stream, a failed start, or an orphan found by a
    /// reattach: no tombstone; a later reattach gets `OPERATION_NOT_FOUND`.
    Released,
    /// Detached too long, or its session closed: tombstoned; a later reattach or
    /// re-submit gets `OPERATION_ABANDONED`.
    Abandoned,
}
