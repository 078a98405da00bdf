// No ReleaseAll of a submission that was never answered: drop it or interrupt it (rx §2.2 T2).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Init, Reattachable>) {
    let _ = e.release_all();
}

fn main() {}
