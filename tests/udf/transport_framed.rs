//! The framed transport (length-delimited protobuf over a Unix socket) end to end: an engine
//! `Session` against a tether worker (`endpoint::serve`) in the same test, with large
//! messages in both directions and hostile frames.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tether::connection::framed::{FramedConfig, FramedError, FramedListener, connect_unix};
use tether::wire::{FrameError, Init, UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat};
use tether::worker::endpoint::{EndpointOutcome, serve};
use tether::worker::engine::{CountingHandle, Session, SessionConfig, Termination, WorkerHandle};
use tokio::io::AsyncWriteExt;

use tether_testing::echo::{EchoUdf, echo_config};
use tether_testing::fixtures::{ScratchDir, framed_error, init, pattern};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_3_9_6_and_20_mib_cross_the_framed_transport_both_ways() {
    let dir = ScratchDir::new("framed");
    let path = dir.join("w.sock");
    let config = FramedConfig::default();
    let listener = FramedListener::bind_unix(&path).expect("bind");
    let worker_config = config.clone();
    let (echo, probe) = EchoUdf::with_probe();
    let worker = tokio::spawn(async move {
        let conn = listener
            .accept::<UdfResponse, UdfRequest>(&worker_config)
            .await
            .expect("accept");
        serve(conn, echo, echo_config()).await
    });
    let conn = connect_unix::<UdfRequest, UdfResponse>(&path, &config)
        .await
        .expect("connect");
    let handle = std::sync::Arc::new(CountingHandle::for_one_session());
    let session = Session::new(conn, handle.clone(), SessionConfig::default());
    let payload = pattern(6 * 1024 * 1024, 7);
    let (session, _) = session
        .init(init(payload.clone()))
        .await
        .map_err(|f| f.error)
        .expect("init");
    assert!(
        probe.lock().unwrap().init_payloads == [payload],
        "the 6 MiB Init payload arrived unaltered"
    );
    let sizes = [3_900 * 1024, 6 * 1024 * 1024, 20 * 1024 * 1024];
    let batches: Vec<Bytes> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();
    let echoed: Vec<Bytes> = session
        .process(futures::stream::iter(batches.clone()))
        .map(|r| r.expect("echo"))
        .collect()
        .await;
    assert_eq!(echoed.len(), 3);
    for (sent, got) in batches.iter().zip(&echoed) {
        assert_eq!(sent.len(), got.len());
        assert!(sent == got, "a {} byte batch came back altered", sent.len());
    }
    assert!(matches!(
        handle.last_outcome(),
        Some(Termination::Finished { .. })
    ));
    assert!(!handle.is_invalid());
    assert!(matches!(
        worker.await.expect("worker task"),
        EndpointOutcome::Finished
    ));
}

#[tokio::test]
async fn an_oversize_length_prefix_fails_the_session_without_allocating() {
    let dir = ScratchDir::new("framed");
    let path = dir.join("w.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let hostile = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        s.write_all(&[0xff, 0xff, 0xff, 0xff]).await.expect("write");
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let config = FramedConfig::default();
    let conn = connect_unix::<UdfRequest, UdfResponse>(&path, &config)
        .await
        .expect("connect");
    let handle = std::sync::Arc::new(CountingHandle::for_one_session());
    let session = Session::new(conn, handle.clone(), SessionConfig::default());
    let init = Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(Bytes::new(), "x"),
    );
    let failed = session.init(init).await.expect_err("oversize frame");
    let error = framed_error(&failed.error);
    assert!(
        matches!(error, FramedError::Frame(FrameError::Oversize { .. })),
        "{error:?}"
    );
    let t = failed.session.close().await;
    assert!(matches!(t, Termination::TransportFailed(_)), "{t}");
    assert!(handle.is_invalid());
    assert_eq!(handle.releases(), 1);
    hostile.abort();
}

#[tokio::test(start_paused = true)]
async fn a_frame_that_never_completes_times_out() {
    let dir = ScratchDir::new("framed");
    let path = dir.join("w.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let hostile = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        // A 100-byte frame of which only 6 bytes ever arrive.
        s.write_all(&[0, 0, 0, 100, 0x0a, 0x00])
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let config = FramedConfig {
        frame_timeout: Duration::from_secs(2),
        ..FramedConfig::default()
    };
    let conn = connect_unix::<UdfRequest, UdfResponse>(&path, &config)
        .await
        .expect("connect");
    let handle = std::sync::Arc::new(CountingHandle::for_one_session());
    let session = Session::new(conn, handle.clone(), SessionConfig::default());
    let init = Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(Bytes::new(), "x"),
    );
    let failed = session.init(init).await.expect_err("trickling frame");
    let error = framed_error(&failed.error);
    assert!(
        matches!(error, FramedError::FrameTimeout(after) if *after == Duration::from_secs(2)),
        "{error:?}"
    );
    let t = failed.session.close().await;
    assert!(matches!(t, Termination::TransportFailed(_)), "{t}");
    assert!(handle.is_invalid());
    hostile.abort();
}
