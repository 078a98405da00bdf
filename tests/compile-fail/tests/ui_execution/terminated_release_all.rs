// Terminated is inspection only (rx §2.3).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Terminated, Reattachable>) {
    let _ = e.release_all();
}

fn main() {}
