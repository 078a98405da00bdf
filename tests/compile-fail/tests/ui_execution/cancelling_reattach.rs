// No reattach once this handle interrupted or released the execution (issue 4 item 6).
#![allow(unused)]
use tether::execution::state;
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<state::Cancelling, Reattachable>) {
    let _ = e.reattach(None);
}

fn main() {}
