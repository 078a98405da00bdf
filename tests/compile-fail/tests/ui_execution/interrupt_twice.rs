// interrupt consumes the Streaming handle (rx §2.2 T9).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, Reattachable>) {
    let first = e.interrupt();
    let second = e.interrupt();
}

fn main() {}
