//! The UDFs the tour's worker runs, chosen by the `Init` payload, over Arrow record batches.
//!
//! The payload (`UdfPayload.format` = [`PAYLOAD_FORMAT`]) is UTF-8 text, one of:
//!
//! | payload | output | what it computes |
//! |---|---|---|
//! | `expr:[name =] <expression>` | `Float64` column `name` (default: the expression) | `+ - * /`, unary `-`, parentheses, numeric literals and numeric columns, e.g. `expr:bill_ratio = bill_length_mm / bill_depth_mm` |
//! | `upper:<column>`, `lower:<column>` | `Utf8` column | the string column upper- or lower-cased |
//! | `generate:<N>` | `id: Int64`, `square: Int64` | a generator: no input, `N` rows emitted after `Finish` in batches of [`GENERATOR_BATCH_ROWS`] |
//!
//! Like a Spark scalar UDF, `expr`, `upper` and `lower` return one column, row-aligned with
//! the input batch (nulls stay null). Arithmetic follows Spark's ANSI mode: a division by a
//! zero divisor (with a non-null dividend) fails the UDF with the error class
//! `DIVIDE_BY_ZERO`, unless `Init.session_conf` sets `spark.sql.ansi.enabled` to `false`,
//! in which case the row's result is null.
//!
//! Errors are typed, never panics: a bad payload is a `UserError` in the `InitResponse`
//! (`PARSE_SYNTAX_ERROR`, `UNRESOLVED_COLUMN`, `DATATYPE_MISMATCH`, `UNRESOLVED_ROUTINE`);
//! input that is not the Arrow IPC the session agreed on is a `ProtocolError`; a failing
//! row is a `UserError` in the `ErrorResponse`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{Array, ArrayRef, AsArray, Float64Array, Int64Array, StringArray};
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, Field, Float64Type, Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use tether::wire::{CancelResponse, ExecutionError, FinishResponse, Init};
use tether::worker::endpoint::Udf;

use super::ipc;

/// The `UdfPayload.format` this worker runs.
pub const PAYLOAD_FORMAT: &str = "tether-tour-udf";
/// Rows per output batch of a `generate:N` UDF.
pub const GENERATOR_BATCH_ROWS: usize = 128;
/// Largest `N` of `generate:N`.
pub const MAX_GENERATED_ROWS: u64 = 1_000_000;
/// Longest accepted payload text, and deepest parenthesis nesting.
const MAX_PAYLOAD_LEN: usize = 4096;
const MAX_DEPTH: usize = 64;

/// Spark's message for `DIVIDE_BY_ZERO` (SQLSTATE 22012).
const DIVIDE_BY_ZERO_MESSAGE: &str = "Division by zero. Use `try_divide` to tolerate divisor being 0 \
     and return NULL instead. If necessary set \"spark.sql.ansi.enabled\" to \"false\" to \
     bypass this error. SQLSTATE: 22012";

fn user(class: &str, message: impl Into<String>) -> ExecutionError {
    ExecutionError::user_with_class(message, class)
}

// ---------------------------------------------------------------------------------------------
// The UDF language
// ---------------------------------------------------------------------------------------------

/// A parsed UDF payload.
#[derive(Debug, Clone, PartialEq)]
pub enum UdfKind {
    /// `expr:[name =] <expression>`.
    Expr {
        /// The output column's name.
        name: String,
        /// The expression.
        expr: Expr,
    },
    /// `upper:<column>` / `lower:<column>`.
    Text {
        /// Upper- or lower-case.
        upper: bool,
        /// The input column.
        column: String,
    },
    /// `generate:<N>`.
    Generate {
        /// Rows to emit.
        rows: u64,
    },
}

/// An arithmetic expression over columns.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A numeric column, read as `Float64`.
    Column(String),
    /// A numeric literal.
    Literal(f64),
    /// Unary minus.
    Neg(Box<Expr>),
    /// A binary operation.
    Binary(Box<Expr>, Op, Box<Expr>),
}

/// A binary arithmetic operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Column(c) => f.write_str(c),
            Expr::Literal(v) => write!(f, "{v}"),
            Expr::Neg(e) => match **e {
                Expr::Binary(..) => write!(f, "-({e})"),
                _ => write!(f, "-{e}"),
            },
            Expr::Binary(l, op, r) => {
                let op = match op {
                    Op::Add => "+",
                    Op::Sub => "-",
                    Op::Mul => "*",
                    Op::Div => "/",
                };
                // Parenthesize compound operands so the text reads back the same.
                let side = |e: &Expr| match e {
                    Expr::Binary(..) => format!("({e})"),
                    _ => e.to_string(),
                };
                write!(f, "{} {op} {}", side(l), side(r))
            }
        }
    }
}

impl Expr {
    /// The columns the expression reads, in first-use order.
    pub fn columns(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect_columns(&mut out);
        out
    }

    fn collect_columns<'a>(&'a self, out: &mut Vec<&'a str>) {
        match self {
            Expr::Column(c) => {
                if !out.contains(&c.as_str()) {
                    out.push(c);
                }
            }
            Expr::Literal(_) => {}
            Expr::Neg(e) => e.collect_columns(out),
            Expr::Binary(l, _, r) => {
                l.collect_columns(out);
                r.collect_columns(out);
            }
        }
    }
}

/// Parses a UDF payload text.
///
/// # Errors
/// `UserError[PARSE_SYNTAX_ERROR]` for malformed text, `UserError[UNRESOLVED_ROUTINE]` for an
/// unknown UDF kind.
pub fn parse(text: &str) -> Result<UdfKind, ExecutionError> {
    if text.len() > MAX_PAYLOAD_LEN {
        return Err(user(
            "PARSE_SYNTAX_ERROR",
            format!(
                "UDF text is {} bytes, more than {MAX_PAYLOAD_LEN}",
                text.len()
            ),
        ));
    }
    let (kind, body) = text.split_once(':').ok_or_else(|| {
        user(
            "PARSE_SYNTAX_ERROR",
            format!("expected `kind:body` (expr, upper, lower, generate), got {text:?}"),
        )
    })?;
    let body = body.trim();
    match kind.trim() {
        "expr" => {
            let (name, source) = match body.split_once('=') {
                Some((name, source)) => {
                    let name = name.trim();
                    if !is_identifier(name) {
                        return Err(user(
                            "PARSE_SYNTAX_ERROR",
                            format!("invalid output column name {name:?}"),
                        ));
                    }
                    (Some(name.to_string()), source)
                }
                None => (None, body),
            };
            let expr = Parser::new(source).parse_all()?;
            let name = name.unwrap_or_else(|| expr.to_string());
            Ok(UdfKind::Expr { name, expr })
        }
        f @ ("upper" | "lower") => {
            if !is_identifier(body) {
                return Err(user(
                    "PARSE_SYNTAX_ERROR",
                    format!("{f}: expected a column name, got {body:?}"),
                ));
            }
            Ok(UdfKind::Text {
                upper: f == "upper",
                column: body.to_string(),
            })
        }
        "generate" => {
            let rows: u64 = body.parse().map_err(|_| {
                user(
                    "PARSE_SYNTAX_ERROR",
                    format!("generate: expected a row count, got {body:?}"),
                )
            })?;
            if rows > MAX_GENERATED_ROWS {
                return Err(user(
                    "INVALID_PARAMETER_VALUE",
                    format!("generate: at most {MAX_GENERATED_ROWS} rows, got {rows}"),
                ));
            }
            Ok(UdfKind::Generate { rows })
        }
        other => Err(user(
            "UNRESOLVED_ROUTINE",
            format!(
                "Cannot resolve routine `{other}`; this worker knows expr, upper, lower, generate"
            ),
        )),
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A recursive-descent parser: `expr = term (('+'|'-') term)*`, `term = factor (('*'|'/')
/// factor)*`, `factor = '-' factor | number | column | '(' expr ')'`.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser {
            src,
            pos: 0,
            depth: 0,
        }
    }

    fn error(&self, what: &str) -> ExecutionError {
        user(
            "PARSE_SYNTAX_ERROR",
            format!(
                "Syntax error at or near position {} of {:?}: {what}",
                self.pos, self.src
            ),
        )
    }

    fn peek(&mut self) -> Option<char> {
        let rest = &self.src[self.pos..];
        let trimmed = rest.trim_start();
        self.pos += rest.len() - trimmed.len();
        trimmed.chars().next()
    }

    fn parse_all(mut self) -> Result<Expr, ExecutionError> {
        let expr = self.expr()?;
        match self.peek() {
            None => Ok(expr),
            Some(c) => Err(self.error(&format!("unexpected {c:?}"))),
        }
    }

    fn expr(&mut self) -> Result<Expr, ExecutionError> {
        let mut lhs = self.term()?;
        while let Some(c @ ('+' | '-')) = self.peek() {
            self.pos += 1;
            let op = if c == '+' { Op::Add } else { Op::Sub };
            lhs = Expr::Binary(Box::new(lhs), op, Box::new(self.term()?));
        }
        Ok(lhs)
    }

    fn term(&mut self) -> Result<Expr, ExecutionError> {
        let mut lhs = self.factor()?;
        while let Some(c @ ('*' | '/')) = self.peek() {
            self.pos += 1;
            let op = if c == '*' { Op::Mul } else { Op::Div };
            lhs = Expr::Binary(Box::new(lhs), op, Box::new(self.factor()?));
        }
        Ok(lhs)
    }

    fn factor(&mut self) -> Result<Expr, ExecutionError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error("expression nested too deeply"));
        }
        let result = self.factor_inner();
        self.depth -= 1;
        result
    }

    fn factor_inner(&mut self) -> Result<Expr, ExecutionError> {
        match self.peek() {
            Some('-') => {
                self.pos += 1;
                Ok(Expr::Neg(Box::new(self.factor()?)))
            }
            Some('(') => {
                self.pos += 1;
                let inner = self.expr()?;
                if self.peek() != Some(')') {
                    return Err(self.error("expected `)`"));
                }
                self.pos += 1;
                Ok(inner)
            }
            Some(c) if c.is_ascii_digit() || c == '.' => {
                let len = self.src[self.pos..]
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(self.src.len() - self.pos);
                let text = &self.src[self.pos..self.pos + len];
                let value = text
                    .parse::<f64>()
                    .map_err(|_| self.error(&format!("invalid number {text:?}")))?;
                self.pos += len;
                Ok(Expr::Literal(value))
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let len = self.src[self.pos..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(self.src.len() - self.pos);
                let name = &self.src[self.pos..self.pos + len];
                self.pos += len;
                Ok(Expr::Column(name.to_string()))
            }
            Some(c) => Err(self.error(&format!("unexpected {c:?}"))),
            None => Err(self.error("unexpected end of expression")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Evaluation over Arrow
// ---------------------------------------------------------------------------------------------

impl UdfKind {
    /// The output schema.
    pub fn output_schema(&self) -> SchemaRef {
        let fields = match self {
            UdfKind::Expr { name, .. } => vec![Field::new(name, DataType::Float64, true)],
            UdfKind::Text { upper, column } => {
                let f = if *upper { "upper" } else { "lower" };
                vec![Field::new(format!("{f}({column})"), DataType::Utf8, true)]
            }
            UdfKind::Generate { .. } => vec![
                Field::new("id", DataType::Int64, false),
                Field::new("square", DataType::Int64, false),
            ],
        };
        Arc::new(Schema::new(fields))
    }

    /// Checks that `schema` has the columns this UDF reads, with usable types.
    ///
    /// # Errors
    /// `UserError[UNRESOLVED_COLUMN]` or `UserError[DATATYPE_MISMATCH]`.
    pub fn check_input(&self, schema: &Schema) -> Result<(), ExecutionError> {
        let (columns, numeric): (Vec<&str>, bool) = match self {
            UdfKind::Expr { expr, .. } => (expr.columns(), true),
            UdfKind::Text { column, .. } => (vec![column.as_str()], false),
            UdfKind::Generate { .. } => return Ok(()),
        };
        for name in columns {
            let Ok(field) = schema.field_with_name(name) else {
                let known: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| format!("`{}`", f.name()))
                    .collect();
                return Err(user(
                    "UNRESOLVED_COLUMN",
                    format!(
                        "A column with name `{name}` cannot be resolved. Did you mean one of \
                         the following? [{}]",
                        known.join(", ")
                    ),
                ));
            };
            let ok = if numeric {
                field.data_type().is_numeric()
            } else {
                matches!(
                    field.data_type(),
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
                )
            };
            if !ok {
                let wanted = if numeric { "a numeric type" } else { "STRING" };
                return Err(user(
                    "DATATYPE_MISMATCH",
                    format!(
                        "Column `{name}` has type {}, but the UDF needs {wanted}",
                        field.data_type()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Applies a row-wise UDF to `batch` (whose first row is row `first_row` of the
    /// session's input), returning the output batch.
    ///
    /// # Errors
    /// A `UserError` (`DIVIDE_BY_ZERO`, an input check failure), or a `WorkerError` when an
    /// Arrow kernel fails.
    pub fn apply(
        &self,
        batch: &RecordBatch,
        first_row: u64,
        ansi: bool,
    ) -> Result<RecordBatch, ExecutionError> {
        self.check_input(&batch.schema())?;
        let column: ArrayRef = match self {
            UdfKind::Expr { expr, .. } => {
                let ctx = EvalContext {
                    batch,
                    first_row,
                    ansi,
                    expr,
                };
                match ctx.eval(expr)? {
                    Value::Array(a) => Arc::new(a),
                    Value::Scalar(v) => Arc::new(Float64Array::from(vec![v; batch.num_rows()])),
                }
            }
            UdfKind::Text { upper, column } => {
                let input = batch
                    .column_by_name(column)
                    .ok_or_else(|| ExecutionError::worker("column vanished after the check"))?;
                let input = arrow::compute::cast(input, &DataType::Utf8).map_err(kernel_error)?;
                let strings = input.as_string::<i32>();
                let out: StringArray = strings
                    .iter()
                    .map(|s| {
                        s.map(|s| {
                            if *upper {
                                s.to_uppercase()
                            } else {
                                s.to_lowercase()
                            }
                        })
                    })
                    .collect();
                Arc::new(out)
            }
            UdfKind::Generate { .. } => {
                return Err(ExecutionError::worker(
                    "a generate:N UDF takes no input batches",
                ));
            }
        };
        RecordBatch::try_new(self.output_schema(), vec![column]).map_err(kernel_error)
    }

    /// The output of a generator, in batches of [`GENERATOR_BATCH_ROWS`] rows (empty for
    /// other UDFs).
    pub fn generate(&self) -> Result<Vec<RecordBatch>, ExecutionError> {
        let UdfKind::Generate { rows } = self else {
            return Ok(Vec::new());
        };
        let schema = self.output_schema();
        let ids: Vec<i64> = (0..*rows as i64).collect();
        ids.chunks(GENERATOR_BATCH_ROWS)
            .map(|chunk| {
                let id = Int64Array::from(chunk.to_vec());
                let square = Int64Array::from(chunk.iter().map(|i| i * i).collect::<Vec<_>>());
                RecordBatch::try_new(schema.clone(), vec![Arc::new(id), Arc::new(square)])
                    .map_err(kernel_error)
            })
            .collect()
    }
}

fn kernel_error(e: arrow::error::ArrowError) -> ExecutionError {
    ExecutionError::worker(format!("Arrow kernel failed: {e}"))
}

/// An arithmetic kernel of `arrow::compute::kernels::numeric`.
type Kernel = fn(
    &dyn arrow::array::Datum,
    &dyn arrow::array::Datum,
) -> Result<ArrayRef, arrow::error::ArrowError>;

enum Value {
    Array(Float64Array),
    Scalar(f64),
}

struct EvalContext<'a> {
    batch: &'a RecordBatch,
    first_row: u64,
    ansi: bool,
    expr: &'a Expr,
}

impl EvalContext<'_> {
    fn eval(&self, e: &Expr) -> Result<Value, ExecutionError> {
        Ok(match e {
            Expr::Literal(v) => Value::Scalar(*v),
            Expr::Column(name) => {
                let column = self
                    .batch
                    .column_by_name(name)
                    .ok_or_else(|| ExecutionError::worker("column vanished after the check"))?;
                let as_f64 =
                    arrow::compute::cast(column, &DataType::Float64).map_err(kernel_error)?;
                Value::Array(as_f64.as_primitive::<Float64Type>().clone())
            }
            Expr::Neg(inner) => match self.eval(inner)? {
                Value::Scalar(v) => Value::Scalar(-v),
                Value::Array(a) => Value::Array(a.unary::<_, Float64Type>(|v| -v)),
            },
            Expr::Binary(l, op, r) => {
                let (l, r) = (self.eval(l)?, self.eval(r)?);
                let r = if *op == Op::Div {
                    self.guard_divisor(&l, r)?
                } else {
                    r
                };
                match (l, r) {
                    (Value::Scalar(a), Value::Scalar(b)) => Value::Scalar(match op {
                        Op::Add => a + b,
                        Op::Sub => a - b,
                        Op::Mul => a * b,
                        Op::Div => a / b,
                    }),
                    (l, r) => {
                        let l = datum(l);
                        let r = datum(r);
                        let kernel: Kernel = match op {
                            Op::Add => numeric::add,
                            Op::Sub => numeric::sub,
                            Op::Mul => numeric::mul,
                            Op::Div => numeric::div,
                        };
                        let out = kernel(l.as_ref(), r.as_ref()).map_err(kernel_error)?;
                        Value::Array(out.as_primitive::<Float64Type>().clone())
                    }
                }
            }
        })
    }

    /// ANSI: fails on the first row whose divisor is zero and whose dividend is not null.
    /// Legacy: turns zero divisors into nulls (the row's result is null).
    fn guard_divisor(&self, dividend: &Value, divisor: Value) -> Result<Value, ExecutionError> {
        let dividend_valid = |row: usize| match dividend {
            Value::Scalar(_) => true,
            Value::Array(a) => a.is_valid(row),
        };
        let rows = self.batch.num_rows();
        let first_zero = match &divisor {
            Value::Scalar(v) if *v == 0.0 => (0..rows).find(|&r| dividend_valid(r)),
            Value::Scalar(_) => None,
            Value::Array(a) => {
                (0..rows).find(|&r| a.is_valid(r) && a.value(r) == 0.0 && dividend_valid(r))
            }
        };
        let Some(row) = first_zero else {
            return Ok(divisor);
        };
        if self.ansi {
            return Err(user(
                "DIVIDE_BY_ZERO",
                format!(
                    "{DIVIDE_BY_ZERO_MESSAGE}\n== UDF ==\n{} (input row {})",
                    self.expr,
                    self.first_row + row as u64
                ),
            ));
        }
        let values: Float64Array = (0..rows)
            .map(|r| {
                let v = match &divisor {
                    Value::Scalar(v) => Some(*v),
                    Value::Array(a) => a.is_valid(r).then(|| a.value(r)),
                };
                v.filter(|v| *v != 0.0)
            })
            .collect();
        Ok(Value::Array(values))
    }
}

fn datum(v: Value) -> Box<dyn arrow::array::Datum> {
    match v {
        Value::Array(a) => Box::new(a),
        Value::Scalar(s) => Box::new(Float64Array::new_scalar(s)),
    }
}

// ---------------------------------------------------------------------------------------------
// The worker-side UDF: Arrow IPC in, Arrow IPC out, metrics
// ---------------------------------------------------------------------------------------------

/// Counters reported in `FinishResponse.metrics` / `CancelResponse.metrics` (names from the
/// typed metrics revision, udf §1.6).
#[derive(Debug, Default, Clone)]
struct Counters {
    rows_in: u64,
    rows_out: u64,
    batches_in: u64,
    batches_out: u64,
    bytes_in: u64,
    bytes_out: u64,
    work: Duration,
}

/// One session's UDF on the worker: decodes each `DataRequest` as an Arrow IPC stream,
/// applies the payload's UDF, encodes the output as an Arrow IPC stream (see
/// [`ipc`](super::ipc) for the exact encoding).
#[derive(Debug)]
pub struct TourUdf {
    kind: Option<UdfKind>,
    ansi: bool,
    /// The schema the engine declared in `Init.input_schema`.
    declared: Option<SchemaRef>,
    counters: Counters,
    /// Sessions initialized by this worker process so far (shared by its sessions).
    sessions: Arc<AtomicU64>,
    /// Which session of this worker process this is (1 = its first; 0 before `init`).
    session_seq: u64,
}

impl TourUdf {
    /// A UDF for one session; `sessions` counts the sessions of this worker process.
    pub fn new(sessions: Arc<AtomicU64>) -> Self {
        TourUdf {
            kind: None,
            ansi: true,
            declared: None,
            counters: Counters::default(),
            sessions,
            session_seq: 0,
        }
    }

    fn metrics(&self) -> BTreeMap<String, String> {
        let c = &self.counters;
        [
            ("rows_in", c.rows_in.to_string()),
            ("rows_out", c.rows_out.to_string()),
            ("batches_in", c.batches_in.to_string()),
            ("batches_out", c.batches_out.to_string()),
            ("bytes_in", c.bytes_in.to_string()),
            ("bytes_out", c.bytes_out.to_string()),
            ("work_wall_nanos", c.work.as_nanos().to_string()),
            ("worker_pid", std::process::id().to_string()),
            ("worker_session_seq", self.session_seq.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn emit(
        &mut self,
        batches: &[RecordBatch],
        out: &mut Vec<Bytes>,
    ) -> Result<(), ExecutionError> {
        let schema = match (batches.first(), &self.kind) {
            (Some(b), _) => b.schema(),
            (None, Some(kind)) => kind.output_schema(),
            (None, None) => return Ok(()),
        };
        let bytes = ipc::encode_stream(&schema, batches).map_err(kernel_error)?;
        self.counters.rows_out += batches.iter().map(|b| b.num_rows() as u64).sum::<u64>();
        self.counters.batches_out += 1;
        self.counters.bytes_out += bytes.len() as u64;
        out.push(bytes);
        Ok(())
    }

    fn process_inner(&mut self, data: &Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        let n = self.counters.batches_in;
        let kind = self
            .kind
            .clone()
            .ok_or_else(|| ExecutionError::worker("data before a successful init"))?;
        let (schema, batches) = ipc::decode_stream(data).map_err(|e| {
            ExecutionError::protocol(format!(
                "DataRequest {n} is not an Arrow IPC stream (data_format = ARROW): {e}"
            ))
        })?;
        if let Some(declared) = &self.declared
            && ipc::fields_only(declared) != ipc::fields_only(&schema)
        {
            return Err(ExecutionError::protocol(format!(
                "DataRequest {n} has schema {schema:?}, not the Init.input_schema {declared:?}"
            )));
        }
        let mut outputs = Vec::with_capacity(batches.len());
        for batch in &batches {
            outputs.push(kind.apply(batch, self.counters.rows_in, self.ansi)?);
            self.counters.rows_in += batch.num_rows() as u64;
        }
        self.emit(&outputs, out)
    }
}

impl Udf for TourUdf {
    fn init(&mut self, init: &Init) -> Result<Option<Bytes>, ExecutionError> {
        self.session_seq = self.sessions.fetch_add(1, Ordering::SeqCst) + 1;
        let udf = init
            .udf
            .as_ref()
            .ok_or_else(|| ExecutionError::protocol("Init.udf is missing"))?;
        if udf.format != PAYLOAD_FORMAT {
            return Err(ExecutionError::worker(format!(
                "unsupported UdfPayload.format {:?}; this worker runs {PAYLOAD_FORMAT:?}",
                udf.format
            )));
        }
        let text = std::str::from_utf8(&udf.payload)
            .map_err(|e| user("PARSE_SYNTAX_ERROR", format!("UDF text is not UTF-8: {e}")))?;
        let kind = parse(text)?;
        self.ansi = !init
            .session_conf
            .get("spark.sql.ansi.enabled")
            .is_some_and(|v| v.eq_ignore_ascii_case("false"));
        if let Some(bytes) = &init.input_schema {
            let schema = ipc::decode_schema(bytes).map_err(|e| {
                ExecutionError::protocol(format!(
                    "Init.input_schema is not an Arrow IPC schema: {e}"
                ))
            })?;
            kind.check_input(&schema)?;
            self.declared = Some(schema);
        }
        let output = ipc::encode_schema(&kind.output_schema()).map_err(kernel_error)?;
        self.kind = Some(kind);
        Ok(Some(output))
    }

    fn process(&mut self, batch: Bytes, out: &mut Vec<Bytes>) -> Result<(), ExecutionError> {
        let started = Instant::now();
        self.counters.batches_in += 1;
        self.counters.bytes_in += batch.len() as u64;
        let result = self.process_inner(&batch, out);
        self.counters.work += started.elapsed();
        result
    }

    fn finish(&mut self, out: &mut Vec<Bytes>) -> Result<FinishResponse, ExecutionError> {
        let started = Instant::now();
        if let Some(kind) = self.kind.clone() {
            for chunk in kind.generate()? {
                self.emit(std::slice::from_ref(&chunk), out)?;
            }
        }
        self.counters.work += started.elapsed();
        Ok(FinishResponse {
            metrics: self.metrics(),
            ..FinishResponse::default()
        })
    }

    fn cancel(&mut self) -> CancelResponse {
        CancelResponse {
            metrics: self.metrics(),
            ..CancelResponse::default()
        }
    }
}
