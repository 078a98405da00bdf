// The engine side of a worker session has one public path, named for its side:
// `tether::worker::engine::Session` (udf §3). The old `tether::worker::Session` is gone, so a
// consumer cannot mistake the engine's session for the worker's.
use tether::worker::Session;

fn main() {}
