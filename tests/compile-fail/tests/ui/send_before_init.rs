// udf §8 scenario #3 (data before init): a Session<Init, _> has no `send`;
// data can only be sent once `init` returned a Session<Streaming, _>.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Init, C>) {
    let _ = session.send(bytes::Bytes::from_static(b"batch")).await;
}

fn main() {
    let _ = misuse;
}
