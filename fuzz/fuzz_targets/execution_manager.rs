//! Operation sequences on `ExecutionManager` (its registry, `ExecutionCore` and
//! `ResponseLog`, rx §2–§5) driven through the public API on a manual clock, against a
//! model client: a producer pushing tagged batches (with the unsent bound's back-pressure),
//! a client that reads, loses responses in flight, drops its stream, reattaches from its
//! last received response, releases what it processed, while time passes (stream
//! rotation) and maintenance runs. Invariants: every response reaches the client exactly
//! once and in order across reattaches, `ResultComplete` last and once; a reattach from the
//! last received response never fails while the execution lives (the retry budget holds
//! what was lost in flight); an interrupted or abandoned execution ends with its error and
//! delivers nothing after; at the end a `ReleaseAll` leaves the registry empty.
#![no_main]

use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tether::execution::{
    ConnectError, ConsumerEvent, ExecutionManager, ManagerConfig, ProduceError, Producer,
    ResponseStream, StreamEnd, StreamLimits, Submitted,
};
use tether::time::ManualClock;
use tether::wire::connect::{
    ExecutePlanRequest, ExecutePlanResponse, InterruptRequest, InterruptType, Plan,
    ReattachExecuteRequest, ReleaseExecuteRequest, UserContext,
    execute_plan_request::RequestOption, execute_plan_response::ResponseType, interrupt_request,
    release_execute_request,
};

const SESSION: &str = "10000000-0000-4000-8000-000000000001";
const OP: &str = "a0000000-0000-4000-8000-00000000000a";

#[derive(Arbitrary, Debug)]
enum Op {
    Produce(u8),
    ProducerFinish,
    ProducerFail,
    Read(u8),
    /// Responses taken off the stream but lost before the client saw them.
    LoseInFlight(u8),
    Disconnect,
    Reattach,
    ReleaseUntil,
    Advance(u8),
    Maintain,
    Interrupt,
    DuplicateExecute,
}

#[derive(Arbitrary, Debug)]
struct Input {
    rotate_bytes: Option<u16>,
    max_unsent: u8,
    ops: Vec<Op>,
}

struct Client {
    received: Vec<u32>,
    last_id: Option<String>,
    complete: bool,
    ended: Option<ConnectError>,
}

fn user() -> Option<UserContext> {
    Some(UserContext::new("fuzz-user"))
}

fn batch(tag: u32) -> ExecutePlanResponse {
    ExecutePlanResponse::arrow_batch(1, Bytes::copy_from_slice(&tag.to_be_bytes()))
}

/// `ReattachExecute` from the client's last received response (rx §3.5).
fn reattach(last_response_id: Option<String>) -> ReattachExecuteRequest {
    ReattachExecuteRequest {
        session_id: SESSION.into(),
        user_context: user(),
        operation_id: OP.into(),
        last_response_id,
        ..Default::default()
    }
}

fn execute() -> ExecutePlanRequest {
    ExecutePlanRequest {
        session_id: SESSION.into(),
        user_context: user(),
        plan: Some(Plan::root(Bytes::from_static(b"fuzz plan"))),
        request_options: vec![RequestOption::reattach(true)],
        operation_id: Some(OP.into()),
        ..Default::default()
    }
}

impl Client {
    /// One event of the stream, as a client sees it.
    fn see(&mut self, ev: &ConsumerEvent, lost: bool) -> bool {
        if lost && !matches!(ev, ConsumerEvent::Response(_)) {
            return false; // the stream broke: the client never learns how it ended
        }
        match ev {
            ConsumerEvent::Response(r) => {
                assert!(!self.complete, "a response after ResultComplete");
                assert!(self.ended.is_none(), "a response after the end");
                if lost {
                    return true;
                }
                match &r.response_type {
                    Some(ResponseType::ArrowBatch(b)) => {
                        let tag = u32::from_be_bytes(b.data[..4].try_into().unwrap());
                        assert_eq!(
                            tag as usize,
                            self.received.len() + 1,
                            "response out of order, duplicated or lost"
                        );
                        self.received.push(tag);
                    }
                    Some(ResponseType::ResultComplete(_)) => self.complete = true,
                    other => panic!("unexpected response {other:?}"),
                }
                assert!(!r.response_id.is_empty());
                self.last_id = Some(r.response_id.clone());
                true
            }
            ConsumerEvent::Pending { .. } => false,
            ConsumerEvent::End(StreamEnd::Complete) => {
                assert!(self.complete, "Complete without ResultComplete");
                false
            }
            ConsumerEvent::End(StreamEnd::Rotated) => false,
            ConsumerEvent::Error(e) => {
                if !matches!(e, ConnectError::Disconnected) {
                    self.ended = Some(e.clone());
                }
                false
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let clock = ManualClock::new();
    let config = ManagerConfig {
        stream: StreamLimits {
            max_duration: Some(Duration::from_secs(10)),
            max_bytes: input.rotate_bytes.map(|b| u64::from(b) + 1),
        },
        detached_timeout: Duration::from_secs(60),
        ..ManagerConfig::default()
    };
    let mut config = config;
    config.log.max_unsent_responses = usize::from(input.max_unsent % 32) + 1;
    let m = ExecutionManager::new(ManagerConfig { timer: Arc::new(clock.clone()), ..config });
    let (producer, stream) = match m.execute_plan(&execute()).expect("a new execution") {
        s @ Submitted::Reattachable(_) => s.start(),
        other => panic!("{other:?}"),
    };
    let mut producer: Option<Producer> = producer;
    let mut stream: Option<ResponseStream> = Some(stream);
    let mut client = Client {
        received: Vec::new(),
        last_id: None,
        complete: false,
        ended: None,
    };
    let mut produced = 0u32;
    let mut finished = false;
    let mut gone = false; // interrupted, failed or abandoned
    for op in input.ops.iter().take(256) {
        match op {
            Op::Produce(n) => {
                if let Some(p) = producer.as_mut() {
                    for _ in 0..=(*n % 8) {
                        match p.try_push(batch(produced + 1)) {
                            Ok(_) => produced += 1,
                            Err(ProduceError::WouldBlock(_)) => break,
                            Err(ProduceError::Cancelled | ProduceError::Closed) => {
                                assert!(gone, "the producer was stopped while live");
                                break;
                            }
                            Err(e) => panic!("unexpected produce error {e:?}"),
                        }
                    }
                }
            }
            Op::ProducerFinish => {
                if let Some(p) = producer.take() {
                    if p.finish().is_ok() {
                        finished = true;
                    }
                }
            }
            Op::ProducerFail => {
                if let Some(p) = producer.take() {
                    let _ = p.fail(ConnectError::Disconnected);
                    gone = true;
                }
            }
            Op::Read(n) | Op::LoseInFlight(n) => {
                let lost = matches!(op, Op::LoseInFlight(_));
                for _ in 0..=(*n % 8) {
                    let Some(s) = stream.as_mut() else { break };
                    let ev = s.try_next();
                    if !client.see(&ev, lost) {
                        if !matches!(ev, ConsumerEvent::Pending { .. }) {
                            stream = None;
                        }
                        break;
                    }
                }
                if lost {
                    // Responses are lost in flight only when the stream breaks.
                    stream = None;
                }
            }
            Op::Disconnect => stream = None,
            Op::Reattach => {
                match m.reattach_execute(&reattach(client.last_id.clone())) {
                    Ok(s) => {
                        if let Some(old) = stream.as_mut() {
                            // The new stream preempts the old one (rx §4.4).
                            let ev = old.try_next();
                            assert!(
                                matches!(ev, ConsumerEvent::Error(ConnectError::Disconnected))
                                    || matches!(
                                        ev,
                                        ConsumerEvent::End(_) | ConsumerEvent::Error(_)
                                    ),
                                "the old stream still runs: {ev:?}"
                            );
                        }
                        stream = Some(s);
                    }
                    Err(e) => {
                        assert!(
                            gone || client.complete || client.ended.is_some(),
                            "a reattach from the last received response failed: {e:?}"
                        );
                        stream = None;
                    }
                }
            }
            Op::ReleaseUntil => {
                if let Some(id) = client.last_id.clone() {
                    let req = ReleaseExecuteRequest {
                        session_id: SESSION.into(),
                        user_context: user(),
                        operation_id: OP.into(),
                        release: Some(release_execute_request::Release::ReleaseUntil(
                            release_execute_request::ReleaseUntil { response_id: id },
                        )),
                        ..Default::default()
                    };
                    let r = m.release_execute(&req);
                    assert!(
                        r.is_ok() || gone,
                        "release-until of a received id failed: {r:?}"
                    );
                }
            }
            Op::Advance(s) => clock.advance(Duration::from_secs(u64::from(*s % 90))),
            Op::Maintain => {
                let report = m.maintain();
                let _ = report;
                if stream.is_none() && m.execution_count() == 0 {
                    gone = true; // abandoned while detached (rx §5.4)
                }
            }
            Op::Interrupt => {
                let req = InterruptRequest {
                    session_id: SESSION.into(),
                    user_context: user(),
                    interrupt_type: InterruptType::OperationId as i32,
                    interrupt: Some(interrupt_request::Interrupt::OperationId(OP.into())),
                    ..Default::default()
                };
                if m.interrupt(&req)
                    .is_ok_and(|r| !r.interrupted_ids.is_empty())
                {
                    gone = true;
                }
            }
            Op::DuplicateExecute => {
                // The same operation id and plan is a reattach from the start (rx §5.2).
                if let Ok(Submitted::Reattached(_)) = m.execute_plan(&execute()) {
                    assert!(!gone || m.execution_count() == 1);
                    stream = None; // the client keeps its own cursor; drop the duplicate
                }
            }
        }
        if m.execution_count() == 0 {
            gone = true;
        }
        assert!(client.received.len() as u32 <= produced);
    }
    if gone || client.ended.is_some() {
        return;
    }
    // Completion: the producer finishes, the client reads (reattaching as needed) until
    // ResultComplete; everything produced arrived exactly once, in order.
    if let Some(p) = producer.take() {
        p.finish().expect("finish");
        finished = true;
    }
    assert!(finished);
    for _ in 0..(produced as usize * 2 + 64) {
        if client.complete {
            break;
        }
        let s = match stream.as_mut() {
            Some(s) => s,
            None => {
                let req = reattach(client.last_id.clone());
                stream = Some(m.reattach_execute(&req).expect("reattach while live"));
                stream.as_mut().unwrap()
            }
        };
        let ev = s.try_next();
        if !client.see(&ev, false) {
            assert!(
                !matches!(ev, ConsumerEvent::Pending { .. }),
                "pending after finish"
            );
            stream = None;
            if client.ended.is_some() {
                break;
            }
        }
    }
    assert!(client.ended.is_none(), "ended with {:?}", client.ended);
    assert!(client.complete, "ResultComplete never arrived");
    assert_eq!(client.received, (1..=produced).collect::<Vec<_>>());
    let req = ReleaseExecuteRequest {
        session_id: SESSION.into(),
        user_context: user(),
        operation_id: OP.into(),
        release: Some(release_execute_request::Release::ReleaseAll(
            release_execute_request::ReleaseAll {},
        )),
        ..Default::default()
    };
    m.release_execute(&req).expect("release all");
    drop(stream);
    assert_eq!(
        m.execution_count(),
        0,
        "ReleaseAll left the execution registered"
    );
});
