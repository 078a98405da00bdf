// Nor after it finished (rx §2.2 T14).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Finishing, NonReattachable>) {
    let _ = e.release_all();
}

fn main() {}
