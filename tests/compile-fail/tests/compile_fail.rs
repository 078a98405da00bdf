//! Compile-fail tests: illegal call orders on the engine-side `Session` typestates do not
//! compile (udf §4.3: the public API edges).
//!
//! Each `tests/ui/<case>.rs` holds one illegal order and names, in its header comment, the udf
//! udf §8 scenario it stands for where one exists; `<case>.stderr` is the expected rustc error
//! (regenerate with `TRYBUILD=overwrite`). `tests/ui/legal_orders.rs` is the positive control:
//! the shared preamble and the legal orders compile.
//!
//! rustc's messages change between releases; the snapshots are for the CI toolchain (stable
//! 1.95).

/// The positive control, run by [`illegal_call_orders_do_not_compile`].
const LEGAL: &str = "legal_orders.rs";

#[test]
fn illegal_call_orders_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.pass(format!("tests/ui/{LEGAL}"));
    let mut cases: Vec<_> = std::fs::read_dir("tests/ui")
        .expect("tests/ui exists")
        .map(|entry| entry.expect("readable tests/ui entry").path())
        .filter(|path| {
            path.extension().is_some_and(|ext| ext == "rs")
                && path.file_name().is_some_and(|name| name != LEGAL)
        })
        .collect();
    cases.sort();
    assert!(cases.len() >= 20, "compile-fail cases missing: {cases:?}");
    for case in cases {
        t.compile_fail(case);
    }
}
