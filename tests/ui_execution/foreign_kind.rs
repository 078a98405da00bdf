// The kind markers are sealed: a third kind cannot be added.
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

struct Maybe;
impl tether::execution::Kind for Maybe {
    const REATTACHABLE: bool = true;
}

fn main() {}
