// The outcome exists only once the execution is Terminated.
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Streaming, Reattachable>) {
    let _ = e.outcome();
}

fn main() {}
