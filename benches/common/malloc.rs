//! glibc malloc settings shared by the benchmarks (`#[path]`-included by each bench binary).

use std::process::Command;

/// Set to `default` to keep glibc's own malloc thresholds (see [`pin`]).
pub const MALLOC_ENV: &str = "TETHER_BENCH_MALLOC";
/// The glibc tunables every process of the run uses unless `TETHER_BENCH_MALLOC=default`:
/// the mmap threshold fixed at 32 MiB (the top of glibc's dynamic range on 64-bit) and the
/// trim threshold at 64 MiB.
pub const PINNED_MALLOC: &str =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=67108864";

/// Re-executes this binary with [`PINNED_MALLOC`] in `GLIBC_TUNABLES` (inherited by the worker
/// processes), unless the caller set `GLIBC_TUNABLES` or `TETHER_BENCH_MALLOC=default`.
///
/// glibc raises its mmap threshold as the process frees large blocks, and trims the heap top
/// when enough is free, so by default one arm's speed depends on what the other arm allocated
/// and freed before it. Measured on case (b)'s bare arm alone, with identical code in the same
/// binary layout: 7.4 ms per iteration after one tether build, 17 ms after another whose
/// buffers left the heap differently. Pinning both thresholds makes every arm allocate from a
/// heap that is never trimmed nor handed to mmap for 64 KiB blocks, whichever ran before.
/// Returns the setting in force, for the summary.
pub fn pin() -> String {
    use std::os::unix::process::CommandExt;
    if let Ok(set) = std::env::var("GLIBC_TUNABLES") {
        return format!("GLIBC_TUNABLES={set}");
    }
    if std::env::var(MALLOC_ENV).as_deref() == Ok("default") {
        return "glibc defaults (dynamic mmap threshold)".to_owned();
    }
    let mut args = std::env::args_os();
    let exe = std::env::current_exe().expect("current exe");
    let _argv0 = args.next();
    let err = Command::new(exe)
        .args(args)
        .env("GLIBC_TUNABLES", PINNED_MALLOC)
        .exec();
    panic!("re-exec with pinned malloc thresholds: {err}");
}
