// Finish before init (udf §2 R3: no Finish before InitResponse): a
// Session<Init, _> has no `finish`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Init, C>) {
    let _ = session.finish().await;
}

fn main() {
    let _ = misuse;
}
