// udf §8 scenario #3 (process before init): `process` exists only on
// Session<Streaming, _>, which only `init` produces.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

fn misuse(session: Session<state::Init, C>) {
    let _ = session.process(futures::stream::empty::<bytes::Bytes>());
}

fn main() {
    let _ = misuse;
}
