// interrupt consumes the Streaming handle (spec §2.2 T9).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Streaming, Reattachable>) {
    let first = e.interrupt();
    let second = e.interrupt();
}

fn main() {}
