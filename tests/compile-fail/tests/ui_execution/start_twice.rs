// start consumes the Init handle: starting twice is a use of a moved value (rx §2.1: notStarted -> started once).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Init, Reattachable>) {
    let first = e.start();
    let second = e.start();
}

fn main() {}
