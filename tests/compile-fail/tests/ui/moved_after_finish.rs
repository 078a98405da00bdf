// Reusing a session after `finish` (udf §4.10 "process twice, or while
// Finishing"): `finish` consumes the Session<Streaming, _>.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Streaming, C>) {
    let finishing = session.finish().await;
    let _ = session.recv().await;
    drop(finishing);
}

fn main() {
    let _ = misuse;
}
