// udf §8 scenario #2 (init twice): the session `init` returns is a
// Session<Streaming, _>, which has no `init`.
use tether::connection::MemoryConnection;
use tether::wire::Init;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Init, C>, init: Init) {
    let Ok((streaming, _response)) = session.init(init.clone()).await else {
        return;
    };
    let _ = streaming.init(init).await;
}

fn main() {
    let _ = misuse;
}
