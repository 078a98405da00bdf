//! The gRPC sides shared by the benchmarks (`#[path]`-included, with the `grpc` feature): the
//! two echo servers a case compares — tether's gRPC worker and a plain tonic server — and
//! the plain client's channel and bidi exchange. Both servers and the plain channel use
//! tether's HTTP/2 settings (`GrpcConfig::default()`), so the arms differ only in tether.

use std::convert::Infallible;
use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use http::Uri;
use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use tether::spark::udf_grpc::{EXECUTE_PATH, GrpcConfig, WorkerServer, WorkerService};
use tether::wire::{UdfRequest, UdfResponse, udf_request, udf_response};
use tether::worker::endpoint::EndpointConfig;
use tether_testing::echo::EchoUdf;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Status, Streaming};
use tonic_prost::ProstCodec;

/// A plain tonic channel over the Unix socket at `path`, with tether's HTTP/2 settings.
/// Panics if it cannot connect.
pub async fn plain_channel(path: &Path, config: &GrpcConfig) -> Channel {
    let path = path.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    });
    Endpoint::from_static("http://worker")
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .http2_adaptive_window(false)
        .max_frame_size(config.max_frame_size)
        .connect_with_connector(connector)
        .await
        .expect("connect to the plain tonic server")
}

/// One plain bidi stream on `channel`: every batch out as `UdfRequest::data` (messages of
/// at most `max` bytes), the echoed data back in order. Panics on anything but data echoes.
pub async fn plain_exchange(channel: Channel, input: &[Bytes], max: usize) -> Vec<Bytes> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
    grpc.ready().await.expect("plain channel ready");
    // tonic needs a 'static request stream: the messages are built up front.
    let requests: Vec<UdfRequest> = input.iter().cloned().map(UdfRequest::data).collect();
    let mut echoes = grpc
        .streaming(
            tonic::Request::new(futures::stream::iter(requests)),
            PathAndQuery::from_static(EXECUTE_PATH),
            ProstCodec::<UdfRequest, UdfResponse>::default(),
        )
        .await
        .expect("plain Execute call")
        .into_inner();
    let mut echoed = Vec::with_capacity(input.len());
    while let Some(message) = echoes.message().await.expect("a plain echo") {
        let Some(udf_response::Response::Data(data)) = message.response else {
            panic!("not a data echo: {message:?}");
        };
        echoed.push(data.data);
    }
    echoed
}

/// Serves tether's gRPC worker (`WorkerService` with the echo UDF) on `path` until the
/// process ends.
pub async fn tether_worker(path: &Path) {
    let service = WorkerService::for_udf(EchoUdf::default, EndpointConfig::default());
    WorkerServer::bind_unix(path, service)
        .expect("bind the gRPC worker")
        .wait()
        .await;
}

/// Serves a plain tonic server on `path` until the process ends: every call maps its
/// request stream to echoes inline (no queue, no protocol), with tether's HTTP/2 settings.
pub async fn tonic_worker(path: &Path) {
    let config = GrpcConfig::default();
    let max = config.max_message_size;
    let listener = UnixListener::bind(path).expect("bind the plain tonic server");
    let incoming = futures::stream::unfold(listener, |listener| async move {
        Some((listener.accept().await.map(|(s, _)| s), listener))
    });
    let echo = tower::service_fn(|call: tonic::Request<Streaming<UdfRequest>>| async move {
        let echoes = call.into_inner().map(|request| {
            request.map(|r| match r.request {
                Some(udf_request::Request::Data(d)) => UdfResponse::data(d.data),
                _ => UdfResponse::default(),
            })
        });
        Ok::<_, Status>(tonic::Response::new(echoes))
    });
    let every_call = tower::service_fn(
        move |request: http::Request<tonic::body::Body>| async move {
            let mut grpc =
                tonic::server::Grpc::new(ProstCodec::<UdfResponse, UdfRequest>::default())
                    .apply_max_message_size_config(Some(max), Some(max));
            Ok::<_, Infallible>(grpc.streaming(echo, request).await)
        },
    );
    Server::builder()
        .initial_stream_window_size(config.stream_window)
        .initial_connection_window_size(config.connection_window)
        .http2_adaptive_window(Some(false))
        .max_frame_size(config.max_frame_size)
        .max_concurrent_streams(config.max_concurrent_streams)
        .serve_with_incoming(every_call, Box::pin(incoming))
        .await
        .expect("serve");
}
