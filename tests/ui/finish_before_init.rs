// Finish before init (spec R3: no Finish before InitResponse): a
// Session<Init, _> has no `finish`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{Session, state::Init};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<Init, C>) {
    let _ = session.finish().await;
}

fn main() {
    let _ = misuse;
}
