// Data after Finish (udf §2: Init → PayloadChunk* → DataRequest* → Finish): a
// Session<Finishing, _> has no `send`.
use tether::connection::MemoryConnection;
use tether::wire::{UdfRequest, UdfResponse};
use tether::worker::{engine::Session, state};

type C = MemoryConnection<UdfRequest, UdfResponse>;

async fn misuse(mut session: Session<state::Finishing, C>) {
    let _ = session.send(bytes::Bytes::from_static(b"batch")).await;
}

fn main() {
    let _ = misuse;
}
