// Nothing but inspection and close on a terminated session
// (udf §4.11 "Terminal | anything | ignored"): Session<Terminated, _> has no `send`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Terminated, C>) {
    let _ = session.send(bytes::Bytes::from_static(b"batch")).await;
}

fn main() {
    let _ = misuse;
}
