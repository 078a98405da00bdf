// ReleaseAll consumes the Streaming handle; the released execution cannot be reattached through it (rx §2.2 T10).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Streaming, Reattachable>) {
    let cancelling = e.release_all();
    let _ = e.reattach(None);
}

fn main() {}
