// A non-reattachable execution has no reattach API at all (issue 4 item 6; spec §5.5 NOT_REATTACHABLE made a compile error).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Streaming, NonReattachable>) {
    let _ = e.reattach(None);
}

fn main() {}
