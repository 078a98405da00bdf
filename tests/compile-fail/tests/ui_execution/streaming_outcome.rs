// The outcome exists only once the execution is Terminated.
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, Reattachable>) {
    let _ = e.outcome();
}

fn main() {}
