//! Operation sequences on the engine core (udf §4): calls of the engine, hostile worker
//! messages, transport events and waits on a fuzzed clock. Invariants (checked by
//! `tether_testing::pair::EngineWatch` after every step): one terminal, first terminal wins, the udf §2 request
//! order, nothing transmitted after a terminal except the best-effort Cancel of a timeout
//! or an interrupt, the deadline table of udf §7, output in order; and at the end `close()`
//! always reaches a terminal through the core's own timers.
#![no_main]

use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tether_testing::fixtures::tagged;
use tether_testing::pair::{CoreWatch, EngineWatch, conn_error};
use tether::worker::engine::EnginePhase;
use tether_fuzz::{FuzzResponse, engine_config, init_message};

#[derive(Arbitrary, Debug)]
enum Op {
    StartInit {
        chunk: Option<u8>,
        len: u8,
    },
    SendData,
    Finish,
    Cancel,
    DiscardOutput,
    Close,
    Interrupt,
    Transmit,
    PopOutput,
    Respond(FuzzResponse),
    StreamEnd,
    ConnectionError,
    /// Wait from now for this many milliseconds (up to ~65 s).
    Wait(u16),
    /// Wait until the armed deadline exactly.
    WaitForDeadline,
    EndWait,
}

#[derive(Arbitrary, Debug)]
struct Input {
    output_buffer: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let config = engine_config(input.output_buffer);
    let mut w = EngineWatch::new(&config);
    let mut now = Instant::now();
    let mut data_tag = 0u32;
    let mut resp_tag = 0u32;
    for op in input.ops.iter().take(256) {
        match op {
            Op::StartInit { chunk, len } => {
                let was = w.core.phase();
                let r = w
                    .core
                    .start_init(init_message(*len), chunk.map(usize::from));
                assert_eq!(
                    r.is_ok(),
                    was == EnginePhase::Created,
                    "start_init only in Created"
                );
            }
            Op::SendData => {
                data_tag += 1;
                let may = w.core.may_send();
                if let Ok(queued) = w.core.send_data(tagged(u64::from(data_tag), 8)) {
                    assert_eq!(queued, may, "send_data queues iff may_send");
                }
            }
            Op::Finish => {
                let may = w.core.may_send();
                if let Ok(queued) = w.core.finish() {
                    assert_eq!(queued, may, "finish queues iff may_send");
                    if queued {
                        assert_eq!(w.core.phase(), EnginePhase::Finishing);
                    }
                }
            }
            Op::Cancel => {
                let first = !w.core.is_terminal() && !w.core.cancel_requested();
                assert_eq!(
                    w.core.cancel(Some("fuzz".into())),
                    first && w.core.stream_opened()
                );
            }
            Op::DiscardOutput => {
                let _ = w.core.discard_output();
                assert_eq!(w.core.output_len(), 0);
            }
            Op::Close => w.core.close(),
            Op::Interrupt => w.core.interrupt("fuzzing"),
            Op::Transmit => {
                w.transmit();
                w.core.end_wait();
            }
            Op::PopOutput => w.pop_all(),
            Op::Respond(r) => {
                resp_tag += 1;
                w.core.handle_response(r.message(resp_tag));
            }
            Op::StreamEnd => w.core.handle_stream_end(),
            Op::ConnectionError => w.core.handle_connection_error(conn_error()),
            Op::Wait(ms) => {
                let until = now + Duration::from_millis(u64::from(*ms));
                w.wait(now, until);
                now = until;
            }
            Op::WaitForDeadline => now = w.wait_for_deadline(now),
            Op::EndWait => w.core.end_wait(),
        }
        w.check();
    }
    // close() always ends the session through the core's own deadlines (udf §5.2), and
    // the request side's shutdown always ends too (udf §7).
    w.core.close();
    for _ in 0..8 {
        w.transmit();
        w.core.begin_wait(now);
        match w.core.poll_timeout() {
            Some(at) => {
                w.wait(now, at);
                now = at;
            }
            None => break,
        }
    }
    w.transmit();
    assert!(w.core.is_terminal(), "close() did not settle a terminal");
    assert!(w.core.poll_timeout().is_none());
});
