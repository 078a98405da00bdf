// udf §8 scenario #16 (settledTermination while non-terminal): `outcome()` exists
// only on Session<Terminated, _>; a Session<Cancelling, _> has none.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

fn misuse(session: Session<state::Cancelling, C>) {
    let _ = session.outcome();
}

fn main() {
    let _ = misuse;
}
