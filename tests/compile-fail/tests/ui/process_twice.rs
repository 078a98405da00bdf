// udf §8 scenario #4 (process twice): `process` consumes the session, so a
// second `process` on the same value is a use of a moved value.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

fn misuse(session: Session<state::Streaming, C>) {
    let first = session.process(futures::stream::empty::<bytes::Bytes>());
    let second = session.process(futures::stream::empty::<bytes::Bytes>());
    drop((first, second));
}

fn main() {
    let _ = misuse;
}
