// No ReleaseAll of a submission that was never answered: drop it or interrupt it (spec §2.2 T2).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Init, Reattachable>) {
    let _ = e.release_all();
}

fn main() {}
