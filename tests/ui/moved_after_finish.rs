// Reusing a session after `finish` (spec §4.10 "process twice, or while
// Finishing"): `finish` consumes the Session<Streaming, _>.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{Session, state::Streaming};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<Streaming, C>) {
    let finishing = session.finish().await;
    let _ = session.recv().await;
    drop(finishing);
}

fn main() {
    let _ = misuse;
}
