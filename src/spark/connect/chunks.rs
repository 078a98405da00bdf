//! Results of any size (connect §10): an Arrow batch larger than a chunk goes out as
//! several `ArrowBatch` responses, each a slice of the batch's Arrow IPC stream, when the
//! client allows it (`ResultChunkingOptions`, Spark 4.1+; PySpark 4.2 allows it by default).
//! Done once here, for every engine, as Spark's `SparkConnectPlanExecution` does it: each
//! chunk carries the batch's `row_count` and `start_offset`, its `chunk_index` from 0 and
//! the `num_chunks_in_batch`; each is its own response of the execution's log (its own
//! response id), so a reattach resumes at any chunk exactly once (rx §3) and the byte
//! bounds count chunk bytes (rx §3.1).

use bytes::Bytes;
use prost::Message;
use smallvec::SmallVec;

use crate::execution::ConnectError;
use crate::wire::connect::{ExecutePlanRequest, ExecutePlanResponse, execute_plan_response};

/// The default largest chunk: 90 % of [`MAX_MESSAGE_SIZE`](super::MAX_MESSAGE_SIZE), as
/// Spark's `spark.connect.session.resultChunking.maxChunkSize` defaults to 90 % of its
/// `spark.connect.grpc.maxInboundMessageSize` (connect §10), leaving room for the rest of
/// the response.
pub const DEFAULT_MAX_CHUNK_SIZE: usize = super::MAX_MESSAGE_SIZE / 10 * 9;

/// The smallest chunk a client's `preferred_arrow_chunk_size` may ask for (1 KiB, as
/// Spark); a smaller preference is ignored.
const MIN_PREFERRED_CHUNK: i64 = 1024;

/// Room left in a message for what a response carries besides its batch (the four ids,
/// field tags and lengths; about 160 bytes).
const RESPONSE_OVERHEAD: usize = 512;

/// How one execution's batches go out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunking {
    /// The chunk size when the client allows chunking; `None` when it does not.
    chunk: Option<usize>,
    /// The largest message the server sends.
    max_message: usize,
}

impl Chunking {
    /// What `request` allows: its preferred chunk size when within
    /// `[1 KiB, max_chunk]`, else `max_chunk` (Spark's rule); no chunking without
    /// `ResultChunkingOptions { allow_arrow_batch_chunking: true }`.
    pub(super) fn of(request: &ExecutePlanRequest, max_chunk: usize, max_message: usize) -> Self {
        let chunk = request
            .result_chunking()
            .filter(|o| o.allow_arrow_batch_chunking && max_chunk > 0)
            .map(|o| match o.preferred_arrow_chunk_size {
                Some(p)
                    if p >= MIN_PREFERRED_CHUNK
                        && usize::try_from(p).is_ok_and(|p| p <= max_chunk) =>
                {
                    usize::try_from(p).unwrap_or(max_chunk)
                }
                _ => max_chunk,
            });
        Self { chunk, max_message }
    }

    /// `response` as it goes out: a batch split into chunks when allowed (every batch then
    /// carries the chunk fields, a small one as chunk 0 of 1, as Spark sends them), else
    /// whole; any other response, or a batch the engine chunked itself, unchanged.
    ///
    /// # Errors
    /// [`ConnectError::BatchTooLarge`] for a whole batch whose response does not fit in
    /// `max_message` bytes when the client did not allow chunking.
    pub(super) fn split(
        &self,
        mut response: ExecutePlanResponse,
    ) -> Result<SmallVec<[ExecutePlanResponse; 1]>, ConnectError> {
        use execute_plan_response::ResponseType;
        let Some(ResponseType::ArrowBatch(batch)) = &mut response.response_type else {
            return Ok(smallvec::smallvec![response]);
        };
        if batch.chunk_index.is_some() || batch.num_chunks_in_batch.is_some() {
            return Ok(smallvec::smallvec![response]);
        }
        let Some(chunk) = self.chunk else {
            let bytes = response.encoded_len().saturating_add(RESPONSE_OVERHEAD);
            if bytes > self.max_message {
                return Err(ConnectError::BatchTooLarge {
                    bytes,
                    limit: self.max_message,
                });
            }
            return Ok(smallvec::smallvec![response]);
        };
        let data: Bytes = std::mem::take(&mut batch.data);
        let count = data.len().div_ceil(chunk).max(1);
        let total = i64::try_from(count).unwrap_or(i64::MAX);
        let template = batch.clone();
        let mut out = SmallVec::with_capacity(count);
        for i in 0..count {
            let from = i * chunk;
            let to = data.len().min(from + chunk);
            let piece = execute_plan_response::ArrowBatch {
                data: data.slice(from..to),
                chunk_index: Some(i64::try_from(i).unwrap_or(i64::MAX)),
                num_chunks_in_batch: Some(total),
                ..template.clone()
            };
            // The first chunk keeps what else the response carried (schema, metrics).
            let mut next = if i == 0 {
                std::mem::take(&mut response)
            } else {
                ExecutePlanResponse::default()
            };
            next.response_type = Some(ResponseType::ArrowBatch(piece));
            out.push(next);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::connect::execute_plan_request::RequestOption;

    fn request(options: Vec<RequestOption>) -> ExecutePlanRequest {
        ExecutePlanRequest {
            request_options: options,
            ..Default::default()
        }
    }

    fn batch(len: usize) -> ExecutePlanResponse {
        let mut r =
            ExecutePlanResponse::arrow_batch(7, (0..len).map(|i| i as u8).collect::<Vec<_>>());
        if let Some(execute_plan_response::ResponseType::ArrowBatch(b)) = &mut r.response_type {
            b.start_offset = Some(42);
        }
        r
    }

    /// `(row_count, start_offset, chunk_index, num_chunks_in_batch, data length)`.
    type Piece = (i64, Option<i64>, Option<i64>, Option<i64>, usize);

    fn pieces(out: &[ExecutePlanResponse]) -> Vec<Piece> {
        out.iter()
            .map(|r| match &r.response_type {
                Some(execute_plan_response::ResponseType::ArrowBatch(b)) => (
                    b.row_count,
                    b.start_offset,
                    b.chunk_index,
                    b.num_chunks_in_batch,
                    b.data.len(),
                ),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_large_batch_is_split_into_chunks_that_reassemble_it() {
        let c = Chunking::of(
            &request(vec![RequestOption::result_chunking(true, Some(4096))]),
            1 << 20,
            1 << 21,
        );
        let whole = batch(10_000);
        let out = c.split(whole.clone()).unwrap();
        assert_eq!(
            pieces(&out),
            vec![
                (7, Some(42), Some(0), Some(3), 4096),
                (7, Some(42), Some(1), Some(3), 4096),
                (7, Some(42), Some(2), Some(3), 1808),
            ]
        );
        let joined: Vec<u8> = out
            .iter()
            .flat_map(|r| match &r.response_type {
                Some(execute_plan_response::ResponseType::ArrowBatch(b)) => b.data.to_vec(),
                _ => vec![],
            })
            .collect();
        let Some(execute_plan_response::ResponseType::ArrowBatch(b)) = whole.response_type else {
            unreachable!()
        };
        assert_eq!(joined, b.data.to_vec());
        // Only the first chunk counts the batch's rows (rx §3: the execution's row count).
        let rows: u64 = out.iter().filter_map(ExecutePlanResponse::row_count).sum();
        assert_eq!(rows, 7);
    }

    #[test]
    fn a_small_batch_is_chunk_0_of_1_when_chunking_is_allowed() {
        let c = Chunking::of(
            &request(vec![RequestOption::result_chunking(true, None)]),
            1 << 20,
            1 << 21,
        );
        assert_eq!(
            pieces(&c.split(batch(10)).unwrap()),
            vec![(7, Some(42), Some(0), Some(1), 10)]
        );
    }

    #[test]
    fn a_preference_outside_1_kib_to_the_maximum_is_ignored() {
        for preferred in [Some(1023), Some(1 << 30), Some(-5), None] {
            let c = Chunking::of(
                &request(vec![RequestOption::result_chunking(true, preferred)]),
                5000,
                1 << 21,
            );
            assert_eq!(c.chunk, Some(5000), "{preferred:?}");
        }
    }

    #[test]
    fn without_chunking_a_batch_that_fits_goes_whole_and_one_that_does_not_fails() {
        for options in [
            vec![],
            vec![RequestOption::result_chunking(false, Some(4096))],
        ] {
            let c = Chunking::of(&request(options), 1 << 20, 20_000);
            assert_eq!(
                pieces(&c.split(batch(10_000)).unwrap()),
                vec![(7, Some(42), None, None, 10_000)]
            );
            let e = c.split(batch(30_000)).unwrap_err();
            assert!(
                matches!(e, ConnectError::BatchTooLarge { limit: 20_000, .. }),
                "{e:?}"
            );
            assert_eq!(e.condition(), Some("ARROW_BATCH_TOO_LARGE"));
        }
    }

    #[test]
    fn other_responses_and_engine_chunked_batches_pass_unchanged() {
        let c = Chunking::of(
            &request(vec![RequestOption::result_chunking(true, Some(1024))]),
            1 << 20,
            1 << 21,
        );
        let schema = ExecutePlanResponse {
            schema: Some(Bytes::from_static(b"x")),
            ..Default::default()
        };
        assert_eq!(c.split(schema.clone()).unwrap().to_vec(), vec![schema]);
        let mut own = batch(5000);
        if let Some(execute_plan_response::ResponseType::ArrowBatch(b)) = &mut own.response_type {
            b.chunk_index = Some(0);
            b.num_chunks_in_batch = Some(1);
        }
        assert_eq!(c.split(own.clone()).unwrap().to_vec(), vec![own]);
    }
}
