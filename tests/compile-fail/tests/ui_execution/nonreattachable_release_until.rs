// A non-reattachable execution has no ReleaseUntil (rx §1.5: ReleaseExecute is only for reattachable executions).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, NonReattachable>) {
    let _ = e.release_until("r");
}

fn main() {}
