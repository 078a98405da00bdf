// Data after Cancel (udf §4.8: nothing is sent after Cancel): a
// Session<Cancelling, _> has no `send`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Cancelling, C>) {
    let _ = session.send(bytes::Bytes::from_static(b"batch")).await;
}

fn main() {
    let _ = misuse;
}
