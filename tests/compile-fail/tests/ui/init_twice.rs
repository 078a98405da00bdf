// udf §8 scenario #2 (init twice): `init` consumes the session, so a second
// `init` on the same value is a use of a moved value.
use tether::connection::MemoryConnection;
use tether::wire::Init;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Init, C>, init: Init) {
    let first = session.init(init.clone()).await;
    let second = session.init(init).await;
    drop((first, second));
}

fn main() {
    let _ = misuse;
}
