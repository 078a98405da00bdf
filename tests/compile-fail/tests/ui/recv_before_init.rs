// udf §8 scenario #3 (data before init): a Session<Init, _> has no `recv`;
// output can only be read after `init` was accepted.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Init, C>) {
    let _ = session.recv().await;
}

fn main() {
    let _ = misuse;
}
