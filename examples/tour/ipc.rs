//! The tour's data encoding: Arrow IPC *streaming format*, one complete stream per protocol
//! message.
//!
//! - `DataRequest.data` and `DataResponse.data`: one whole IPC stream each — the schema
//!   message, the record batch message(s) (the engine and this worker write exactly one
//!   batch; the worker reads any number) and the end-of-stream marker (`0xFFFFFFFF
//!   0x00000000`). Every message is self-describing, so a session never depends on an
//!   earlier message's dictionary or schema state, and a zero-row batch is still non-empty
//!   bytes (udf §1.4).
//! - `Init.input_schema` and the `InitResponse.data` this worker answers with (the output
//!   schema): an IPC stream holding only the schema message and the end-of-stream marker.
//!
//! Decoding never trusts its input: any error (truncated, corrupt, not Arrow) comes back as
//! an [`ArrowError`], and the decoder runs under `catch_unwind` as well, so even a bug in the
//! IPC reader turns into an error rather than taking a worker down.

use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use bytes::Bytes;

/// Encodes `batches` (all of schema `schema`) as one IPC stream.
pub fn encode_stream(schema: &Schema, batches: &[RecordBatch]) -> Result<Bytes, ArrowError> {
    let mut writer = StreamWriter::try_new(Vec::new(), schema)?;
    for batch in batches {
        writer.write(batch)?;
    }
    writer.finish()?;
    Ok(Bytes::from(writer.into_inner()?))
}

/// Encodes one batch as one IPC stream (schema, batch, end-of-stream).
pub fn encode_batch(batch: &RecordBatch) -> Result<Bytes, ArrowError> {
    encode_stream(&batch.schema(), std::slice::from_ref(batch))
}

/// Encodes a schema alone (schema message, end-of-stream).
pub fn encode_schema(schema: &Schema) -> Result<Bytes, ArrowError> {
    encode_stream(schema, &[])
}

/// Decodes one IPC stream into its schema and batches.
pub fn decode_stream(data: &[u8]) -> Result<(SchemaRef, Vec<RecordBatch>), ArrowError> {
    guarded(|| {
        let reader = StreamReader::try_new(data, None)?;
        let schema = reader.schema();
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        Ok((schema, batches))
    })
}

/// Decodes a schema-only IPC stream (batches, if any, are ignored).
pub fn decode_schema(data: &[u8]) -> Result<SchemaRef, ArrowError> {
    guarded(|| Ok(StreamReader::try_new(data, None)?.schema()))
}

/// Runs `f`, turning a panic into an error (defence in depth for untrusted input).
fn guarded<T>(f: impl FnOnce() -> Result<T, ArrowError>) -> Result<T, ArrowError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        Err(ArrowError::IpcError(format!("IPC decoder failed: {what}")))
    })
}

/// A schema with the same fields, for comparisons that ignore metadata.
pub fn fields_only(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(schema.fields().clone()))
}
