//! Operation sequences on the worker core (udf §2): hostile engine requests, the user's
//! answers in any order, transport events and waits on a fuzzed clock. Invariants
//! (checked by `tether_testing::pair::WorkerWatch` after every step): one outcome (only a transport failure
//! before the terminator may replace it), exactly one terminator on the wire, nothing after
//! it, no DataResponse before the InitResponse or after a Cancel, an error or the
//! terminator, tickets that move once, misuse that changes nothing, the R4 deadline; and at
//! the end an engine Cancel always ends the session.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tether_testing::fixtures::tagged;
use tether_testing::pair::{CoreWatch, WorkerWatch, conn_error};
use tether::wire::{CancelResponse, FinishResponse, UdfRequest};
use tether::worker::endpoint::WorkerPhase;
use tether_fuzz::{Answer, FuzzRequest, worker_config};

#[derive(Arbitrary, Debug)]
enum Op {
    Request(FuzzRequest),
    User(Answer),
    SendData,
    Transmit,
    PopInput,
    DiscardInput,
    StreamEnd,
    ConnectionError,
    Wait(u16),
    WaitForDeadline,
}

#[derive(Arbitrary, Debug)]
struct Input {
    input_buffer: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let mut w = WorkerWatch::new(&worker_config(input.input_buffer));
    let mut now = Instant::now();
    let (mut req_tag, mut out_tag) = (0u32, 0u32);
    for op in input.ops.iter().take(256) {
        match op {
            Op::Request(r) => {
                req_tag += 1;
                w.core.handle_request(r.message(req_tag));
            }
            Op::User(a) => {
                let _ = w.user((*a).into());
            }
            Op::SendData => {
                out_tag += 1;
                let _ = w.send_data(tagged(u64::from(out_tag), 8));
            }
            Op::Transmit => {
                w.transmit();
            }
            Op::PopInput => {
                w.pop_all();
            }
            Op::DiscardInput => {
                let _ = w.core.discard_input();
                assert_eq!(w.core.input_len(), 0);
            }
            Op::StreamEnd => w.core.handle_stream_end(),
            Op::ConnectionError => w.core.handle_connection_error(conn_error()),
            Op::Wait(ms) => {
                let until = now + Duration::from_millis(u64::from(*ms) * 4);
                w.wait(now, until);
                now = until;
            }
            Op::WaitForDeadline => now = w.wait_for_deadline(now),
        }
        w.check();
    }
    // The engine's Cancel always ends the session (udf §2 R5 (b)): answered automatically
    // or by the user, and then exactly one terminator is on the wire.
    w.transmit();
    w.core
        .handle_request(UdfRequest::cancel(Some("end of input".into())));
    match w.core.phase() {
        WorkerPhase::Cancelling => w.core.cancelled(CancelResponse::default()).unwrap(),
        WorkerPhase::Draining => w.core.finish(FinishResponse::default()).unwrap(),
        _ => {}
    }
    w.transmit();
    w.check();
    assert!(
        w.core.is_done(),
        "a Cancel did not end the session: {:?}",
        w.core.phase()
    );
    assert!(w.core.wants_half_close());
});
