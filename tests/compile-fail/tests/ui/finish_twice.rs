// Finish twice (udf §2: at most one Finish per stream): a Session<Finishing, _>
// has no `finish`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Finishing, C>) {
    let _ = session.finish().await;
}

fn main() {
    let _ = misuse;
}
