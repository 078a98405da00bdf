// Positive control for the compile-fail cases in this directory: the same imports, connection
// type and calls, in orders the protocol allows, compile. A compile-fail case therefore fails
// for its illegal call order, not for a typo in the shared preamble.
use tether::connection::MemoryConnection;
use tether::wire::Init;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn legal(session: Session<state::Init, C>, init: Init) {
    let mut streaming = match session.init(init).await {
        Ok((streaming, _response)) => streaming,
        Err(failed) => {
            let _ = failed.session.outcome();
            let _ = failed.session.close().await;
            return;
        }
    };
    let _ = streaming.send(bytes::Bytes::from_static(b"batch")).await;
    let _ = streaming.recv().await;
    let mut finishing = match streaming.finish().await {
        Ok(finishing) => finishing,
        Err(failed) => {
            let _ = failed.session.close().await;
            return;
        }
    };
    let _ = finishing.recv().await;
    let mut cancelling = finishing.cancel(None).await;
    let _ = cancelling.recv().await;
    let terminated = cancelling.wait().await;
    let _ = terminated.outcome();
    let _ = terminated.phase();
    let _ = terminated.termination();
    let _ = terminated.close().await;
}

fn process(session: Session<tether::worker::state::Streaming, C>) {
    let _ = session.process(futures::stream::empty::<bytes::Bytes>());
}

fn main() {
    let _ = legal;
    let _ = process;
}
