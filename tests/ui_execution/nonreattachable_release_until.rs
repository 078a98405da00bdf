// A non-reattachable execution has no ReleaseUntil (spec §1.5: ReleaseExecute is only for reattachable executions).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Streaming, NonReattachable>) {
    let _ = e.release_until("r");
}

fn main() {}
