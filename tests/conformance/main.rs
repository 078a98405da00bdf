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
//!   with entries, optional fields at their zero values, unknown enum values): tether's bytes
//!   decode in Python to the same values (compared as protobuf JSON built here by hand), and
//!   the bytes Python encodes from those values decode in tether to the same values.
//! - `grpc::*` (feature `grpc`): a tether engine [`Session`](tether::worker::engine::Session)
//!   drives a Python grpcio worker, and a Python grpcio engine drives a tether worker
//!   ([`WorkerServer`](tether::spark::udf_grpc::WorkerServer) + `endpoint::serve`), over a
//!   Unix socket, through finish, cancel and error; messages of 3.9, 6 and 20 MiB cross in
//!   both directions.

mod cases;
#[cfg(feature = "grpc")]
mod grpc;
mod json;
mod python;

use std::collections::BTreeMap;

use tether::wire::{UdfProtoCommunicationPattern, UdfWorkerDataFormat};

use cases::{MAP_ENTRY_DEFAULT_CASES, SCHEMA_TYPES, cases};
use json::{Json, Obj, hex, unhex};
use python::python_env;

#[test]
fn every_message_type_matches_the_official_schema_both_ways() {
    let Some(env) = python_env("every_message_type_matches_the_official_schema_both_ways") else {
        return;
    };
    let cases = cases();
    let request = Obj::new()
        .set(
            "cases",
            Json::Arr(
                cases
                    .iter()
                    .map(|c| {
                        Obj::new()
                            .set("type", Json::str(c.proto))
                            .set("case", Json::str(&c.name))
                            .set("hex", Json::Str(hex(&c.bytes)))
                            .set("expected", c.expected.clone())
                            .done()
                    })
                    .collect(),
            ),
        )
        .set(
            "enums",
            Json::strs(&["UDFWorkerDataFormat", "UDFProtoCommunicationPattern"]),
        )
        .done();

    let output = env.run("proto_check.py", request.to_string().into_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        matches!(output.status.code(), Some(0 | 1)),
        "proto_check.py failed ({}): {stderr}",
        output.status
    );
    let report = Json::parse(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));

    // Coverage, against the official descriptors: every type, every field, every branch.
    let official: Vec<&str> = report
        .get("schema_types")
        .as_arr()
        .iter()
        .filter_map(Json::as_str)
        .collect();
    assert_eq!(official, SCHEMA_TYPES, "the official message types");
    assert_eq!(
        report.get("missing_types"),
        &Json::Arr(vec![]),
        "types without an empty and a full case"
    );
    assert_eq!(
        report.get("unset_fields"),
        &Json::Obj(BTreeMap::new()),
        "fields no full case sets"
    );

    let results = report.get("results").as_arr();
    assert_eq!(results.len(), cases.len());
    let mut failures = Vec::new();
    let mut identical_bytes = 0;
    for (case, result) in cases.iter().zip(results) {
        let label = format!("{} / {}", case.proto, case.name);
        assert_eq!(result.get("type").as_str(), Some(case.proto));
        assert_eq!(result.get("case").as_str(), Some(case.name.as_str()));
        for error in result.get("errors").as_arr() {
            failures.push(format!(
                "{label}: python: {}",
                error.as_str().unwrap_or("?")
            ));
        }
        // tether -> Python: the official decoder saw exactly the values tether encoded.
        if result.get("decoded") != &case.expected {
            failures.push(format!(
                "{label}: official decode {} != expected {}",
                result.get("decoded"),
                case.expected
            ));
        }
        // Python -> tether: the official encoder's bytes decode in tether to the same value.
        let Some(python_hex) = result.get("python_hex").as_str() else {
            failures.push(format!("{label}: no bytes from Python"));
            continue;
        };
        let python_bytes = unhex(python_hex);
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
            // Both sides encode fields in number order and maps sorted by key, so anything
            // but map entries at their default values must come out byte for byte the same.
            failures.push(format!(
                "{label}: encodings differ: tether {} python {}",
                hex(&case.bytes),
                python_hex
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(output.status.code(), Some(0), "{stderr}");

    // The enums: every official name maps to tether's value and back.
    let enums = report.get("enums");
    let check_enum = |name: &str, tether: &dyn Fn(&str) -> Option<i32>, count: usize| {
        let Json::Obj(values) = enums.get(name) else {
            panic!("no enum {name} in the report");
        };
        assert_eq!(values.len(), count, "{name} values");
        for (value_name, number) in values {
            assert_eq!(
                tether(value_name).map(|v| v.to_string()),
                Some(number.to_string()),
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

    let versions = report.get("versions");
    eprintln!(
        "conformance: {} message types, {} cases ({} byte-identical both ways), protobuf {} ({}), grpcio-tools {}",
        SCHEMA_TYPES.len(),
        cases.len(),
        identical_bytes,
        versions.get("protobuf").as_str().unwrap_or("?"),
        versions.get("protobuf_backend").as_str().unwrap_or("?"),
        versions.get("grpcio-tools").as_str().unwrap_or("?"),
    );
}
