// Terminated is inspection only (DESIGN.md Typestates).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Terminated, Reattachable>) {
    let _ = e.interrupt();
}

fn main() {}
