// Finishing is release-all only (issue 4 item 6).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Finishing, Reattachable>) {
    let _ = e.release_until("r");
}

fn main() {}
