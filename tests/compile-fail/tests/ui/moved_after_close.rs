// Reusing a session after `close` (udf §5: close is the single finalizer):
// `close` consumes the session, so it cannot be used, or closed, again.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(session: Session<state::Streaming, C>) {
    let outcome = session.close().await;
    let again = session.close().await;
    drop((outcome, again));
}

fn main() {
    let _ = misuse;
}
