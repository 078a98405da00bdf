// Nothing but inspection and close on a terminated session
// (udf §4.11 "Terminal | anything | ignored"): Session<Terminated, _> has no `wait`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Terminated, C>) {
    let _ = session.wait().await;
}

fn main() {
    let _ = misuse;
}
