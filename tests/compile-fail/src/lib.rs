//! No library: the crate exists for its tests, the trybuild cases of tether's typestates
//! (`tests/compile_fail.rs`: the worker session, udf §4.3; `tests/compile_fail_execution.rs`:
//! the execution, rx §2.3).
