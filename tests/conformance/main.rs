//! Wire conformance against Spark 4.3.0's official schema, checked by the official Python
//! implementation (udf §1).
//!
//! The `.proto` files are never copied here: `tests/python/udf_protos.py` locates them with
//! the oracle's extraction script and compiles them with grpcio-tools (pinned in
//! `tests/python/requirements.txt`) into `target/py-gen/`. The Python venv lives at
//! `target/py-venv`, set up by `scripts/python-env.sh` (which `scripts/test.sh` runs first);
//! `TETHER_PYTHON` overrides the interpreter. Without it these tests print a loud
//! `SKIPPED: …` line, and fail under `CI=true`.
//!
//! - [`every_message_type_matches_the_official_schema_both_ways`]: every message type of
//!   the four files, with no field set and with every field set (each oneof branch, maps
//!   with entries, optional fields at their zero values, unknown enum values). For each
//!   value, `proto_check.py` builds the same message with the official classes from tether's
//!   field values by tether's field names ([`fields`]), checks that the official decoder reads
//!   tether's bytes as exactly that message, and encodes it deterministically; those bytes
//!   must equal tether's own encoding and decode in tether to the same value.
//! - `schema::*`: the prost types against the `.proto` text itself, field by field (number,
//!   wire type, presence) and enum value by enum value, with the small reader in `oracle`.
//! - `grpc::*` (feature `grpc`): a tether engine [`Session`](tether::worker::engine::Session)
//!   drives a Python grpcio worker, and a Python grpcio engine drives a tether worker
//!   ([`WorkerServer`](tether::spark::udf_grpc::WorkerServer) + `endpoint::serve`), over a
//!   Unix socket, through finish, cancel and error; messages of 3.9, 6 and 20 MiB cross in
//!   both directions.

mod cases;
mod fields;
#[cfg(feature = "grpc")]
mod grpc;
mod oracle;
mod python;
mod schema;

use base64::prelude::{BASE64_STANDARD, Engine as _};
use serde_json::{Value, json};
use tether::wire::{UdfProtoCommunicationPattern, UdfWorkerDataFormat};

use cases::{MAP_ENTRY_DEFAULT_CASES, SCHEMA_TYPES, cases};
use python::python_env;

#[test]
fn every_message_type_matches_the_official_schema_both_ways() {
    let Some(env) = python_env("every_message_type_matches_the_official_schema_both_ways") else {
        return;
    };
    let cases = cases();
    let request = json!({
        "cases": cases
            .iter()
            .map(|c| json!({
                "type": c.proto,
                "case": c.name,
                "bytes": BASE64_STANDARD.encode(&c.bytes),
                "fields": c.fields,
            }))
            .collect::<Vec<_>>(),
        "enums": ["UDFWorkerDataFormat", "UDFProtoCommunicationPattern"],
    });

    let output = env.run("proto_check.py", request.to_string().into_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "proto_check.py failed ({}): {stderr}",
        output.status
    );
    let report: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));

    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), cases.len());
    let mut failures = Vec::new();
    let mut identical_bytes = 0;
    for (case, result) in cases.iter().zip(results) {
        let label = case.label();
        assert_eq!(result["type"], case.proto);
        assert_eq!(result["case"], case.name.as_str());
        // tether -> Python: the official decoder read tether's bytes as the message built
        // by name from tether's values, with no field it does not know (checked there).
        for error in result["errors"].as_array().expect("errors") {
            failures.push(format!(
                "{label}: python: {}",
                error.as_str().unwrap_or("?")
            ));
        }
        // Python -> tether: the official encoder's bytes decode in tether to the same value.
        let Some(python_bytes) = result["python"].as_str() else {
            failures.push(format!("{label}: no bytes from Python"));
            continue;
        };
        let python_bytes = BASE64_STANDARD.decode(python_bytes).expect("base64");
        if let Err(e) = (case.decodes_to_value)(&python_bytes) {
            failures.push(format!("{label}: Python's bytes in tether: {e}"));
        }
        if case.name == "empty" {
            assert!(
                case.bytes.is_empty(),
                "{label}: tether encodes an empty message"
            );
            assert!(
                python_bytes.is_empty(),
                "{label}: Python encodes an empty message"
            );
        }
        if python_bytes == case.bytes {
            identical_bytes += 1;
        } else if !MAP_ENTRY_DEFAULT_CASES.contains(&label.as_str()) {
            // Both sides encode fields in number order (prost sorts them by tag, a oneof at
            // its lowest tag, and no message here numbers a field inside a oneof's range)
            // and map entries by key (`BTreeMap`; deterministic serialization), so anything
            // but map entries at their default values must come out byte for byte the same.
            failures.push(format!(
                "{label}: encodings differ: {}",
                difference(&case.bytes, &python_bytes)
            ));
        }
    }
    // Coverage, against the official descriptors: every type, every field, every branch.
    for (what, found, wanted) in [
        (
            "the official message types",
            &report["schema_types"],
            json!(SCHEMA_TYPES.as_slice()),
        ),
        (
            "types without an empty and a full case",
            &report["missing_types"],
            json!([]),
        ),
        (
            "fields no full case sets",
            &report["unset_fields"],
            json!({}),
        ),
    ] {
        if *found != wanted {
            failures.push(format!("{what}: {found}, expected {wanted}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures ({} cases):\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");

    // The enums: every official name maps to tether's value and back.
    let check_enum = |name: &str, tether: &dyn Fn(&str) -> Option<i32>, count: usize| {
        let values = report["enums"][name]
            .as_object()
            .unwrap_or_else(|| panic!("no enum {name} in the report"));
        assert_eq!(values.len(), count, "{name} values");
        for (value_name, number) in values {
            assert_eq!(
                tether(value_name).map(i64::from),
                number.as_i64(),
                "{name}.{value_name}"
            );
        }
    };
    check_enum(
        "UDFWorkerDataFormat",
        &|n| UdfWorkerDataFormat::from_str_name(n).map(|v| v as i32),
        2,
    );
    check_enum(
        "UDFProtoCommunicationPattern",
        &|n| UdfProtoCommunicationPattern::from_str_name(n).map(|v| v as i32),
        2,
    );

    let versions = &report["versions"];
    eprintln!(
        "conformance: {} message types, {} cases ({} byte-identical both ways), protobuf {} ({}), grpcio-tools {}",
        SCHEMA_TYPES.len(),
        cases.len(),
        identical_bytes,
        versions["protobuf"].as_str().unwrap_or("?"),
        versions["protobuf_backend"].as_str().unwrap_or("?"),
        versions["grpcio-tools"].as_str().unwrap_or("?"),
    );
}

/// Where two encodings part, with the next few bytes of each.
fn difference(tether: &[u8], python: &[u8]) -> String {
    let at = tether
        .iter()
        .zip(python)
        .take_while(|(a, b)| a == b)
        .count();
    let window = |bytes: &[u8]| bytes[at..bytes.len().min(at + 16)].to_vec();
    format!(
        "from byte {at} (of {} and {}): tether {:02x?}, python {:02x?}",
        tether.len(),
        python.len(),
        window(tether),
        window(python)
    )
}
