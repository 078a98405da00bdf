// The state markers are sealed: no new typestates from outside the crate.
#![allow(unused)]
use tether::execution::state::{Cancelling, Finishing, Init, Streaming, Terminated};
use tether::execution::{Execution, NonReattachable, Reattachable};

struct Mine;
impl tether::execution::state::State for Mine {
    const NAME: &'static str = "Mine";
}

fn main() {}
