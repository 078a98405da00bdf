// No reattach before the execution started (SPARK-49492, spec §7 scenario 17: NOT_REATTACHABLE).
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

fn misuse(e: Execution<Init, Reattachable>) {
    let _ = e.reattach(None);
}

fn main() {}
