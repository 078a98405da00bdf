// No reattach before the execution started (SPARK-49492, rx §7 scenario 17: NOT_REATTACHABLE).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Init, Reattachable>) {
    let _ = e.reattach(None);
}

fn main() {}
