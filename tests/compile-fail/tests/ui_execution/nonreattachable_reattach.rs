// A non-reattachable execution has no reattach API at all (issue 4 item 6; rx §5.5 NOT_REATTACHABLE made a compile error).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, NonReattachable>) {
    let _ = e.reattach(None);
}

fn main() {}
