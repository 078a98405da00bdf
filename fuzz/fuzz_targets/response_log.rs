//! Operation sequences on `ResponseLog` (rx §3) against a model written with plain vectors
//! and linear sums: push (with the unsent bound), finish (with or without
//! `ResultComplete`), fail, consume at any index (a client cursor that reattaches
//! backwards, forwards, anywhere), release-until and position by any produced id or a
//! foreign one. Invariants: indexes are consecutive from 1; every consumed response is the
//! one pushed at that index, stamped with its id; the automatic release policy (rx §3.4)
//! and `ReleaseUntil` release exactly the model's prefix; retained and unsent bytes equal
//! the model's sums and stay within the retry budget (plus the one straddling response)
//! and the unsent bound (plus one oversize response or the final `ResultComplete`).
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tether::execution::{ConnectError, Consumed, LogConfig, PushError, ResponseLog, Stamp};
use tether::wire::connect::{ExecutePlanResponse, execute_plan_response::ResponseType};

#[derive(Arbitrary, Debug)]
enum Op {
    Push(u8),
    Finish(bool),
    Fail,
    /// Consume the client's next index.
    Next,
    /// Move the client's cursor back (a reattach from an older response).
    Back(u8),
    /// Consume any index.
    At(u8),
    ReleaseUntil(u8),
    ReleaseForeign,
    Position(u8),
    Clear,
}

#[derive(Arbitrary, Debug)]
struct Input {
    budget: u16,
    max_unsent_bytes: u16,
    max_unsent_responses: u8,
    ops: Vec<Op>,
}

struct Model {
    /// `sizes[i - 1]`, `tags[i - 1]`: the stamped size and payload tag of index `i`.
    sizes: Vec<u64>,
    tags: Vec<Option<u32>>,
    first: u64,
    highest: u64,
    final_index: Option<u64>,
    failed: bool,
    rc_appended: bool,
}

impl Model {
    fn last(&self) -> u64 {
        self.sizes.len() as u64
    }
    fn sum(&self, from: u64, to: u64) -> u64 {
        (from.max(1)..=to)
            .map(|i| self.sizes[(i - 1) as usize])
            .sum()
    }
    fn unsent_start(&self) -> u64 {
        self.highest.max(self.first - 1) + 1
    }
}

fn batch(tag: u32) -> ExecutePlanResponse {
    ExecutePlanResponse::arrow_batch(
        1,
        Bytes::copy_from_slice(&tag.to_be_bytes()).repeat(1 + (tag as usize % 7)),
    )
}

fn tag_of(r: &ExecutePlanResponse) -> Option<u32> {
    match &r.response_type {
        Some(ResponseType::ArrowBatch(b)) => {
            Some(u32::from_be_bytes(b.data[..4].try_into().unwrap()))
        }
        _ => None,
    }
}

fuzz_target!(|input: Input| {
    let config = LogConfig {
        retry_budget: u64::from(input.budget),
        max_unsent_bytes: u64::from(input.max_unsent_bytes),
        max_unsent_responses: usize::from(input.max_unsent_responses % 16),
    };
    let stamp = Stamp {
        session_id: Arc::from("s"),
        server_side_session_id: Arc::from("ss"),
        operation_id: Arc::from("op"),
    };
    let mut log = ResponseLog::new(config, stamp);
    let mut m = Model {
        sizes: Vec::new(),
        tags: Vec::new(),
        first: 1,
        highest: 0,
        final_index: None,
        failed: false,
        rc_appended: false,
    };
    let mut cursor = 1u64;
    let mut tag = 0u32;
    for op in input.ops.iter().take(512) {
        let consume_at = match op {
            Op::Push(n) => {
                for _ in 0..=(*n % 4) {
                    tag += 1;
                    let r = batch(tag);
                    let size = log.stamped_len(&r);
                    let unsent = (m.last() + 1 - m.unsent_start()) as usize;
                    let unsent_bytes = m.sum(m.unsent_start(), m.last());
                    let blocks = unsent > 0
                        && (unsent >= config.max_unsent_responses.max(1)
                            || unsent_bytes + size > config.max_unsent_bytes);
                    assert_eq!(log.would_block(size), blocks);
                    match log.push(r) {
                        Ok(i) => {
                            assert!(m.final_index.is_none() && !blocks);
                            assert_eq!(i, m.last() + 1, "indexes are consecutive");
                            m.sizes.push(size);
                            m.tags.push(Some(tag));
                        }
                        Err(PushError::Finished(_)) => assert!(m.final_index.is_some()),
                        Err(PushError::WouldBlock(back)) => {
                            assert!(m.final_index.is_none() && blocks);
                            assert!(back.response_id.is_empty());
                        }
                        Err(PushError::BudgetFull(_)) => {
                            panic!("BudgetFull from a log that has no memory budget")
                        }
                    }
                }
                None
            }
            Op::Finish(rc) => {
                let r = log.finish(*rc);
                assert_eq!(r.is_ok(), m.final_index.is_none());
                if r.is_ok() {
                    if *rc {
                        m.sizes
                            .push(log.stamped_len(&ExecutePlanResponse::result_complete()));
                        m.tags.push(None);
                        m.rc_appended = true;
                    }
                    m.final_index = Some(m.last());
                }
                None
            }
            Op::Fail => {
                let r = log.fail(ConnectError::Disconnected);
                assert_eq!(r.is_ok(), m.final_index.is_none());
                if r.is_ok() {
                    m.failed = true;
                    m.final_index = Some(m.last());
                }
                None
            }
            Op::Next => Some(cursor),
            Op::Back(k) => {
                cursor = cursor.saturating_sub(u64::from(*k % 4)).max(1);
                Some(cursor)
            }
            Op::At(i) => Some(u64::from(*i % 40)),
            Op::ReleaseUntil(k) => {
                let j = u64::from(*k) % (m.last() + 2);
                if let Some(id) = log.id_at(j) {
                    let r = log.release_until(&id.hyphenated().to_string());
                    if j <= m.highest {
                        assert_eq!(r, Ok(j));
                        m.first = m.first.max(j + 1);
                    } else {
                        assert!(matches!(r, Err(ConnectError::PositionNotFound { .. })));
                    }
                } else {
                    assert!(j == 0 || j > m.last());
                }
                None
            }
            Op::ReleaseForeign => {
                let r = log.release_until("00000000-0000-4000-8000-000000000000");
                assert!(matches!(r, Err(ConnectError::PositionNotFound { .. })));
                assert!(log.position(Some("")).is_err());
                None
            }
            Op::Position(k) => {
                let j = u64::from(*k) % (m.last() + 1);
                if let Some(id) = log.id_at(j) {
                    let r = log.position(Some(&id.to_string()));
                    if j <= m.highest {
                        assert_eq!(r, Ok(j + 1));
                        cursor = j + 1;
                    } else {
                        assert!(r.is_err());
                    }
                }
                assert_eq!(log.position(None), Ok(1));
                None
            }
            Op::Clear => {
                log.clear();
                m.first = m.last() + 1;
                None
            }
        };
        if let Some(at) = consume_at {
            let i = at.max(1);
            let r = log.consume(at);
            if i > m.last() {
                let want = match m.final_index {
                    Some(_) => Consumed::End(m.failed.then_some(ConnectError::Disconnected)),
                    None => Consumed::Pending,
                };
                assert_eq!(r, Ok(want));
            } else if i < m.first {
                assert!(
                    matches!(r, Err(ConnectError::PositionNotAvailable { index, .. }) if index == i)
                );
            } else {
                let Ok(Consumed::Response(resp, size)) = r else {
                    panic!("index {i} held but not returned: {r:?}");
                };
                assert_eq!(size, m.sizes[(i - 1) as usize], "size of index {i}");
                assert_eq!(
                    tag_of(&resp),
                    m.tags[(i - 1) as usize],
                    "payload of index {i}"
                );
                assert_eq!(
                    Some(resp.response_id.as_str()),
                    log.id_at(i).map(|u| u.to_string()).as_deref()
                );
                assert_eq!(log.index_of(&resp.response_id), Some(i));
                assert_eq!(resp.operation_id, "op");
                m.highest = m.highest.max(i);
                // rx §3.4: release the front while the kept responses after it, up to
                // i - 1, reach the budget.
                while m.first < i && m.sum(m.first + 1, i - 1) >= config.retry_budget {
                    m.first += 1;
                }
                cursor = i + 1;
            }
        }
        // The log equals the model.
        assert_eq!(log.last_produced(), m.last());
        assert_eq!(log.first_retained(), m.first, "released prefix");
        assert_eq!(log.highest_consumed(), m.highest);
        assert_eq!(log.final_index(), m.final_index);
        let kept_end = m.highest.min(m.last());
        let retained = if kept_end < m.first {
            0
        } else {
            m.sum(m.first, kept_end)
        };
        assert_eq!(log.retained_bytes(), retained);
        let unsent = m.sum(m.unsent_start(), m.last());
        assert_eq!(log.unsent_bytes(), unsent);
        let unsent_len = (m.last() + 1 - m.unsent_start()) as usize;
        assert_eq!(log.unsent_len(), unsent_len);
        // Bounds: the unsent bound (one oversize response, or the final ResultComplete,
        // may exceed it) ...
        let extra = usize::from(m.rc_appended);
        assert!(unsent_len <= config.max_unsent_responses.max(1) + extra);
        if unsent_len > 1 + extra {
            let rc = if m.rc_appended {
                *m.sizes.last().unwrap()
            } else {
                0
            };
            assert!(unsent <= config.max_unsent_bytes + rc, "unsent bound");
        }
        // ... and the retry budget: what is kept before the last consumed response stays
        // under it, except the one response that straddles it.
        if m.highest > m.first {
            assert!(
                m.sum(m.first + 1, m.highest - 1) < config.retry_budget || m.highest == m.first + 1
            );
        }
        assert!(log.peak_unsent_bytes() >= unsent);
        for i in 1..=m.last() {
            assert_eq!(log.is_available(i), i >= m.first);
        }
    }
});
