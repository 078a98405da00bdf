//! Compile-fail tests for the execution typestates (rx §2.3: the
//! typestates over the runner states).
//!
//! Each `tests/ui_execution/<case>.rs` holds one illegal use of
//! [`Execution<S, K>`](tether::execution::Execution) and says in its header comment which
//! protocol rule it stands for; `<case>.stderr` is the expected rustc error (regenerate with
//! `TRYBUILD=overwrite`). `legal_orders.rs` is the positive control.
//!
//! rustc's messages change between releases; the snapshots are for the CI toolchain.

const DIR: &str = "tests/ui_execution";
const LEGAL: &str = "legal_orders.rs";

#[test]
fn illegal_execution_uses_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.pass(format!("{DIR}/{LEGAL}"));
    let mut cases: Vec<_> = std::fs::read_dir(DIR)
        .expect("tests/ui_execution exists")
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "rs")
                && path.file_name().is_some_and(|name| name != LEGAL)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "compile-fail cases missing: {cases:?}");
    for case in cases {
        t.compile_fail(case);
    }
}
