// Finishing is release-all only (issue 4 item 6).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Finishing, Reattachable>) {
    let _ = e.release_until("r");
}

fn main() {}
