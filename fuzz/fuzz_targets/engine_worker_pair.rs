//! The engine core × the worker core (udf §2, §4) as `tether_testing::pair::Pair` runs
//! them, with fuzzed schedules: calls on either side, deliveries of any number of in-flight
//! messages (order within each direction preserved, arbitrary delays), Cancel / close /
//! interrupt at any point, a cut stream, and time passing on the pair's clock so that
//! timeouts come from the cores' own timers. The pair checks every step (one terminal per
//! side, first wins, nothing after a terminal, the udf §2 order, every batch crossing at
//! most once and in order); at the end it runs the session to completion and checks that
//! the two outcomes agree (`Pair::assert_agreement`):
//! - no side ever sees a protocol violation from the other, except the worker's R4
//!   timeout or an engine that itself timed out or was interrupted;
//! - engine Finished ⇒ worker Finished, and every batch crossed exactly once, in order;
//! - engine Cancelled on an opened stream ⇒ worker Cancelled (or its R4 close);
//! - unless the stream was cut: worker Finished ⇒ engine Finished, worker Cancelled ⇒
//!   engine Cancelled, each unless the engine's own deadline ended it first.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tether_testing::fixtures::tagged;
use tether_testing::pair::{Pair, WorkerUser};
use tether_fuzz::{Answer, engine_config, init_message, worker_config};

#[derive(Arbitrary, Debug)]
enum Op {
    StartInit { chunk: Option<u8>, len: u8 },
    SendData,
    Finish,
    Cancel,
    Close,
    Interrupt,
    EnginePop,
    User(Answer),
    WorkerSend,
    WorkerPop,
    ToWorker(u8),
    ToEngine(u8),
    Tick(u16),
    Cut,
}

#[derive(Arbitrary, Debug)]
struct Input {
    output_buffer: u8,
    input_buffer: u8,
    /// The reference echo worker of udf §2.1 answers (else the ops do).
    echo: bool,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let user = if input.echo {
        WorkerUser::Echo
    } else {
        WorkerUser::Manual
    };
    let mut p = Pair::new(
        &engine_config(input.output_buffer),
        &worker_config(input.input_buffer),
    )
    .with_worker_user(user);
    let (mut data_tag, mut out_tag) = (0u32, 1u32 << 31);
    for op in input.ops.iter().take(256) {
        match op {
            Op::StartInit { chunk, len } => {
                let _ = p.start_init(init_message(*len), chunk.map(usize::from));
            }
            Op::SendData => {
                data_tag += 1;
                let _ = p.send(tagged(u64::from(data_tag), 8));
            }
            Op::Finish => {
                let _ = p.finish();
            }
            Op::Cancel => {
                p.cancel("fuzz");
            }
            Op::Close => p.close(),
            Op::Interrupt => p.interrupt("fuzzing"),
            Op::EnginePop => {
                p.engine_read();
            }
            // The echo worker's user answers by itself: the worker-side ops are its.
            Op::User(_) | Op::WorkerSend | Op::WorkerPop if input.echo => {}
            Op::User(a) => {
                let _ = p.worker_user((*a).into());
            }
            Op::WorkerSend => {
                out_tag += 1;
                let _ = p.worker_send(tagged(u64::from(out_tag), 8));
            }
            Op::WorkerPop => {
                p.worker_read();
            }
            Op::ToWorker(n) => {
                p.deliver_to_worker(usize::from(*n % 8) + 1);
            }
            Op::ToEngine(n) => {
                p.deliver_to_engine(usize::from(*n % 8) + 1);
            }
            Op::Tick(ms) => p.advance(Duration::from_millis(u64::from(*ms) * 8)),
            Op::Cut => p.cut(),
        }
    }
    p.complete();
    assert!(p.is_settled());
});
