//! The tour's data set: `examples/data/penguins.csv` (Palmer penguins, CC0; see
//! `examples/data/SOURCE.md`) read into Arrow record batches with arrow-csv's schema
//! inference. The file writes missing values as `NA`, which the reader treats as null, so
//! the measurement columns infer as numbers.

use std::error::Error;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::csv::ReaderBuilder;
use arrow::csv::reader::Format;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;

/// The CSV shipped with the example.
pub fn default_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/penguins.csv")
}

/// A CSV file as Arrow batches.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// The inferred schema.
    pub schema: SchemaRef,
    /// The rows, in batches of at most the requested size.
    pub batches: Vec<RecordBatch>,
}

impl Dataset {
    /// Total rows.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// Reads `path` (with a header row; empty fields and `NA` are null), inferring the schema
/// from every row, in batches of at most `batch_rows` rows.
pub fn load(path: &Path, batch_rows: usize) -> Result<Dataset, Box<dyn Error>> {
    let format = Format::default()
        .with_header(true)
        .with_null_regex(regex::Regex::new("^(NA)?$")?);
    let (schema, _) = format.infer_schema(File::open(path)?, None)?;
    let schema = Arc::new(schema);
    let reader = ReaderBuilder::new(schema.clone())
        .with_format(format)
        .with_batch_size(batch_rows.max(1))
        .build(File::open(path)?)?;
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    Ok(Dataset { schema, batches })
}
