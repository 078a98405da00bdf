// start consumes the Init handle: starting twice is a use of a moved value (spec §2.1: notStarted -> started once).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Init, Reattachable>) {
    let first = e.start();
    let second = e.start();
}

fn main() {}
