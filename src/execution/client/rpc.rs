//! [`ExecutionRpc`]: the three Spark Connect RPCs a reattaching client needs, as a small
//! transport-agnostic trait (rx §1.1).

use std::sync::Arc;

use futures::Stream;
use futures::future::BoxFuture;

use crate::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, ReattachExecuteRequest, ReleaseExecuteRequest,
    ReleaseExecuteResponse,
};

use super::error::RpcError;

/// The client end of `SparkConnectService`'s `ExecutePlan`, `ReattachExecute` and
/// `ReleaseExecute` (rx §1.1), over any transport: a gRPC channel, an in-memory server, a
/// scripted fake.
///
/// - Each method starts one RPC and returns a `'static` future, so implementations clone what
///   they need (a tonic client is cheap to clone) and the caller can keep or spawn it.
/// - The streaming calls resolve to the response stream. A failure may surface either from
///   the future (the call was refused) or as the stream's first item (gRPC server-streaming
///   calls report connection errors on the first read, rx §6.2, §7.6 #67); the client
///   treats both alike.
/// - A stream ending with `None` is the server's `onCompleted`: for a reattachable execution
///   without a preceding `ResultComplete` it means "reattach" (rx §1.3).
/// - Dropping a stream or future cancels its RPC.
/// - Errors are [`RpcError`]s carrying the status code and the Spark error condition
///   (rx §1.8); which ones are retried is the [`RetryPolicy`](super::RetryPolicy)'s call.
pub trait ExecutionRpc: Send + Sync + 'static {
    /// The response stream of `ExecutePlan` and `ReattachExecute`.
    type Stream: Stream<Item = Result<ExecutePlanResponse, RpcError>> + Send + 'static;

    /// Starts `ExecutePlan` (rx §1.2).
    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>>;

    /// Starts `ReattachExecute` (rx §1.4).
    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>>;

    /// Calls `ReleaseExecute` (rx §1.5). A response with `operation_id` unset (the
    /// execution was already gone) is a success (rx §1.6).
    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>>;
}

impl<T: ExecutionRpc + ?Sized> ExecutionRpc for Arc<T> {
    type Stream = T::Stream;

    fn execute_plan(
        &self,
        request: ExecutePlanRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        (**self).execute_plan(request)
    }

    fn reattach_execute(
        &self,
        request: ReattachExecuteRequest,
    ) -> BoxFuture<'static, Result<Self::Stream, RpcError>> {
        (**self).reattach_execute(request)
    }

    fn release_execute(
        &self,
        request: ReleaseExecuteRequest,
    ) -> BoxFuture<'static, Result<ReleaseExecuteResponse, RpcError>> {
        (**self).release_execute(request)
    }
}
