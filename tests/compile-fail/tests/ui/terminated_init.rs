// udf §8 scenario #2 (init after the session ended, udf §4.10 "init twice / after
// terminal / after close"): Session<Terminated, _> has no `init`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Terminated, C>) {
    let _ = session.init(tether::wire::Init::default()).await;
}

fn main() {
    let _ = misuse;
}
