//! The tour's UDF worker logic (`examples/tour/udf.rs`, `ipc.rs`) run in-process: an engine
//! `Session` and the worker's `serve` joined by the in-memory connection, over the real
//! penguins data. Checks the Arrow IPC round trip (values computed correctly, nulls kept,
//! row alignment), the `DIVIDE_BY_ZERO` user error, generators, cancel metrics, and that bad
//! input gives typed errors rather than panics.

#![cfg(feature = "tokio")]

#[allow(dead_code)]
#[path = "../../examples/tour/data.rs"]
mod data;
#[allow(dead_code)]
#[path = "../../examples/tour/ipc.rs"]
mod ipc;
#[allow(dead_code)]
#[path = "../../examples/tour/udf.rs"]
mod udf;

use std::sync::Arc;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use futures::StreamExt;
use tether::connection::{MemoryConnection, pair};
use tether::wire::{
    Init, UdfPayload, UdfRequest, UdfResponse, UdfWorkerDataFormat, execution_error,
};
use tether::worker::endpoint::{EndpointConfig, serve};
use tether::worker::engine::{
    CountingHandle, Session, SessionConfig, Termination, TerminationKind, WorkerHandle,
};

type Conn = MemoryConnection<UdfRequest, UdfResponse>;

fn penguins() -> data::Dataset {
    data::load(&data::default_path(), 32).expect("penguins.csv loads")
}

fn start() -> (
    Session<tether::worker::state::Init, Conn>,
    Arc<CountingHandle>,
) {
    let (engine, worker) = pair::<UdfRequest, UdfResponse>(8);
    tokio::spawn(serve(
        worker,
        udf::TourUdf::new(Arc::default()),
        EndpointConfig::default(),
    ));
    let handle = Arc::new(CountingHandle::for_one_session());
    (
        Session::new(engine, handle.clone(), SessionConfig::default()),
        handle,
    )
}

fn init(text: &str, schema: Option<&arrow::datatypes::Schema>) -> Init {
    let mut init = Init::new(
        UdfWorkerDataFormat::Arrow,
        UdfPayload::new(Bytes::copy_from_slice(text.as_bytes()), udf::PAYLOAD_FORMAT),
    );
    init.input_schema = schema.map(|s| ipc::encode_schema(s).expect("schema encodes"));
    init
}

fn encoded(data: &data::Dataset) -> Vec<Bytes> {
    data.batches
        .iter()
        .map(|b| ipc::encode_batch(b).expect("batch encodes"))
        .collect()
}

/// Runs `text` over `inputs`; returns the decoded output batches and the termination.
async fn run(
    init: Init,
    inputs: Vec<Bytes>,
) -> (Vec<RecordBatch>, Termination, Arc<CountingHandle>) {
    let (session, handle) = start();
    let (session, response) = match session.init(init).await {
        Ok(ok) => ok,
        Err(failed) => return (Vec::new(), failed.session.close().await, handle),
    };
    // The worker answers Init with the output schema.
    let schema = ipc::decode_schema(response.data.as_deref().unwrap_or_default())
        .expect("InitResponse.data is an IPC schema");
    let mut stream = session.process(futures::stream::iter(inputs));
    let mut outputs = Vec::new();
    while let Some(Ok(bytes)) = stream.next().await {
        let (out_schema, batches) = ipc::decode_stream(&bytes).expect("output decodes");
        assert_eq!(ipc::fields_only(&out_schema), ipc::fields_only(&schema));
        outputs.extend(batches);
    }
    (outputs, stream.close().await, handle)
}

fn metric(t: &Termination, name: &str) -> Option<u64> {
    t.metrics()?.get(name)?.parse().ok()
}

#[tokio::test]
async fn ratio_values_are_computed_per_row_with_nulls_kept() {
    let data = penguins();
    assert_eq!(data.rows(), 344);
    assert_eq!(
        data.schema
            .field_with_name("bill_length_mm")
            .map(|f| f.data_type().clone())
            .ok(),
        Some(DataType::Float64),
        "NA is read as null, so the column infers as a number"
    );
    let text = "expr:bill_ratio = bill_length_mm / bill_depth_mm";
    let (outputs, t, handle) = run(init(text, Some(&data.schema)), encoded(&data)).await;
    assert_eq!(t.kind(), TerminationKind::Finished, "{t}");
    assert_eq!(metric(&t, "rows_in"), Some(344));
    assert_eq!(metric(&t, "rows_out"), Some(344));
    assert_eq!(outputs.len(), data.batches.len());
    let mut nulls = 0;
    for (input, output) in data.batches.iter().zip(&outputs) {
        assert_eq!(input.num_rows(), output.num_rows(), "row-aligned");
        assert_eq!(output.schema().field(0).name(), "bill_ratio");
        let len = input
            .column_by_name("bill_length_mm")
            .unwrap()
            .as_primitive::<Float64Type>();
        let depth = input
            .column_by_name("bill_depth_mm")
            .unwrap()
            .as_primitive::<Float64Type>();
        let ratio = output.column(0).as_primitive::<Float64Type>();
        for row in 0..input.num_rows() {
            if len.is_null(row) || depth.is_null(row) {
                assert!(ratio.is_null(row));
                nulls += 1;
            } else {
                assert!((ratio.value(row) - len.value(row) / depth.value(row)).abs() < 1e-12);
            }
        }
    }
    assert_eq!(nulls, 2, "the two penguins without measurements");
    assert!(!handle.is_invalid());
}

#[tokio::test]
async fn precedence_literals_and_integer_columns() {
    let data = penguins();
    let text = "expr:-(body_mass_g - 1000) / 2 * 0.001 + year";
    let (outputs, t, _) = run(init(text, Some(&data.schema)), encoded(&data)).await;
    assert_eq!(t.kind(), TerminationKind::Finished, "{t}");
    let first = &outputs[0];
    let v = first.column(0).as_primitive::<Float64Type>().value(0);
    // Row 0: body_mass_g 3750, year 2007.
    assert!(
        (v - (-(3750.0 - 1000.0) / 2.0 * 0.001 + 2007.0)).abs() < 1e-9,
        "{v}"
    );
    assert_eq!(
        first.schema().field(0).name(),
        "((-(body_mass_g - 1000) / 2) * 0.001) + year"
    );
}

#[tokio::test]
async fn division_by_zero_is_a_user_error_after_the_earlier_output() {
    let data = penguins();
    let text = "expr:body_mass_g / (year - 2009)";
    let (outputs, t, handle) = run(init(text, Some(&data.schema)), encoded(&data)).await;
    assert_eq!(t.kind(), TerminationKind::Cancelled, "{t}");
    let error = t.execution_error().expect("the worker reported an error");
    assert_eq!(error.error_class(), Some("DIVIDE_BY_ZERO"));
    assert!(
        error.message().contains("input row 100"),
        "{}",
        error.message()
    );
    // Rows 0..96 (batches 0–2) were fine; batch 3 holds row 100, the first 2009 penguin.
    assert_eq!(outputs.len(), 3);
    assert!(t.is_salvageable());
    assert!(!handle.is_invalid());
}

#[tokio::test]
async fn without_ansi_a_zero_divisor_gives_null() {
    let data = penguins();
    let mut init = init("expr:body_mass_g / (year - 2009)", Some(&data.schema));
    init.session_conf
        .insert("spark.sql.ansi.enabled".into(), "false".into());
    let (outputs, t, _) = run(init, encoded(&data)).await;
    assert_eq!(t.kind(), TerminationKind::Finished, "{t}");
    let nulls: usize = outputs.iter().map(|b| b.column(0).null_count()).sum();
    // Null where the divisor is zero (the 2009 penguins) or the dividend is null.
    let expected: usize = data
        .batches
        .iter()
        .map(|b| {
            let mass = b.column_by_name("body_mass_g").unwrap();
            let year = b
                .column_by_name("year")
                .unwrap()
                .as_primitive::<Int64Type>();
            (0..b.num_rows())
                .filter(|&r| mass.is_null(r) || year.value(r) == 2009)
                .count()
        })
        .sum();
    assert_eq!(nulls, expected);
}

#[tokio::test]
async fn upper_keeps_nulls_and_rows() {
    let data = penguins();
    let (outputs, t, _) = run(init("upper:sex", Some(&data.schema)), encoded(&data)).await;
    assert_eq!(t.kind(), TerminationKind::Finished, "{t}");
    let first = outputs[0].column(0).as_string::<i32>();
    assert_eq!(first.value(0), "MALE");
    assert_eq!(first.value(1), "FEMALE");
    assert!(first.is_null(3), "row 3 has sex NA");
    assert_eq!(
        outputs.iter().map(RecordBatch::num_rows).sum::<usize>(),
        344
    );
}

#[tokio::test]
async fn generator_emits_rows_with_zero_inputs() {
    let (outputs, t, _) = run(init("generate:300", None), Vec::new()).await;
    assert_eq!(t.kind(), TerminationKind::Finished, "{t}");
    assert_eq!(metric(&t, "batches_in"), Some(0));
    assert_eq!(outputs.len(), 3, "128 + 128 + 44 rows");
    let last = &outputs[2];
    let id = last.column(0).as_primitive::<Int64Type>();
    let square = last.column(1).as_primitive::<Int64Type>();
    assert_eq!((id.value(43), square.value(43)), (299, 299 * 299));
}

#[tokio::test]
async fn cancel_reports_partial_metrics() {
    let data = penguins();
    let inputs = encoded(&data);
    let (session, handle) = start();
    let (mut session, _) = session
        .init(init("lower:island", Some(&data.schema)))
        .await
        .map_err(|f| f.error)
        .unwrap();
    for input in &inputs[..2] {
        session.send(input.clone()).await.unwrap();
        assert!(session.recv().await.unwrap().is_some());
    }
    let t = session.cancel(Some("enough".into())).await.close().await;
    assert_eq!(t.kind(), TerminationKind::Cancelled, "{t}");
    assert_eq!(metric(&t, "batches_in"), Some(2));
    assert_eq!(metric(&t, "rows_in"), Some(64));
    assert!(!handle.is_invalid());
}

fn is_protocol(t: &Termination) -> bool {
    matches!(
        t.execution_error().and_then(|e| e.kind.as_ref()),
        Some(execution_error::Kind::Protocol(_))
    )
}

#[tokio::test]
async fn bad_arrow_input_is_a_typed_protocol_error() {
    let data = penguins();
    let good = encoded(&data).remove(0);
    let truncated = good.slice(..good.len() / 2);
    for bad in [
        Bytes::from_static(b"definitely not arrow"),
        truncated,
        Bytes::new(),
    ] {
        let (outputs, t, handle) = run(
            init("upper:species", Some(&data.schema)),
            vec![good.clone(), bad],
        )
        .await;
        assert_eq!(outputs.len(), 1, "the good batch came back");
        assert_eq!(t.kind(), TerminationKind::Cancelled, "{t}");
        assert!(is_protocol(&t), "{t}");
        assert!(!handle.is_invalid(), "the worker reported it in-band");
    }
}

#[tokio::test]
async fn a_batch_with_another_schema_is_rejected() {
    let data = penguins();
    let other = data.batches[0].project(&[0, 1]).unwrap();
    let (_, t, _) = run(
        init("upper:species", Some(&data.schema)),
        vec![ipc::encode_batch(&other).unwrap()],
    )
    .await;
    assert!(is_protocol(&t), "{t}");
}

#[tokio::test]
async fn init_errors_carry_spark_error_classes() {
    let data = penguins();
    let cases = [
        ("expr:bill_lenght_mm / 2", "UNRESOLVED_COLUMN"),
        ("expr:bill_length_mm / (2", "PARSE_SYNTAX_ERROR"),
        ("expr:1 +", "PARSE_SYNTAX_ERROR"),
        ("upper:bill_length_mm", "DATATYPE_MISMATCH"),
        ("expr:species * 2", "DATATYPE_MISMATCH"),
        ("sqrt:bill_length_mm", "UNRESOLVED_ROUTINE"),
        ("generate:many", "PARSE_SYNTAX_ERROR"),
        ("generate:99999999999", "INVALID_PARAMETER_VALUE"),
    ];
    for (text, class) in cases {
        let (_, t, _) = run(init(text, Some(&data.schema)), Vec::new()).await;
        assert_eq!(t.kind(), TerminationKind::Cancelled, "{text}: {t}");
        assert_eq!(
            t.execution_error().and_then(|e| e.error_class()),
            Some(class),
            "{text}: {t}"
        );
    }
    // Deep nesting and long texts are errors, not stack overflows.
    for text in [
        format!("expr:{}1{}", "(".repeat(100), ")".repeat(100)),
        format!("expr:{}", "1+".repeat(5000)),
    ] {
        let (_, t, _) = run(init(&text, None), Vec::new()).await;
        assert_eq!(
            t.execution_error().and_then(|e| e.error_class()),
            Some("PARSE_SYNTAX_ERROR"),
            "{t}"
        );
    }
    // A payload in another format is refused by the worker.
    let mut foreign = init("upper:species", None);
    if let Some(u) = foreign.udf.as_mut() {
        u.format = "cloudpickle".into();
    }
    let (_, t, _) = run(foreign, Vec::new()).await;
    assert!(
        t.execution_error()
            .is_some_and(|e| e.message().contains("cloudpickle"))
    );
}

#[test]
fn parser_round_trips_and_columns() {
    let kind = udf::parse("expr: a + b * (c - 2) / -d").unwrap();
    let udf::UdfKind::Expr { name, expr } = kind else {
        panic!("an expr")
    };
    assert_eq!(name, "a + ((b * (c - 2)) / -d)");
    assert_eq!(expr.columns(), ["a", "b", "c", "d"]);
    assert_eq!(
        udf::parse(&format!("expr:{name}")).unwrap(),
        udf::parse("expr: a + b * (c - 2) / -d").unwrap()
    );
}
