// A non-reattachable execution has no ReleaseAll: it is released when its stream ends (rx §2.2 T14).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, NonReattachable>) {
    let _ = e.release_all();
}

fn main() {}
