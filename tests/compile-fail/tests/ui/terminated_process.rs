// Nothing but inspection and close on a terminated session
// (udf §4.11 "Terminal | anything | ignored"): Session<Terminated, _> has no `process`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

fn misuse(session: Session<state::Terminated, C>) {
    let _ = session.process(futures::stream::empty::<bytes::Bytes>());
}

fn main() {
    let _ = misuse;
}
