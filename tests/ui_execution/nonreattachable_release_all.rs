// A non-reattachable execution has no ReleaseAll: it is released when its stream ends (spec §2.2 T14).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Streaming, NonReattachable>) {
    let _ = e.release_all();
}

fn main() {}
