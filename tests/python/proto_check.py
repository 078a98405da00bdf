"""Message conformance oracle: checks tether's protobuf encoding against the official classes.

Driven by tests/conformance.rs, one process for the whole batch. Reads one JSON document on
stdin:

    {"cases": [{"type": "Init", "case": "full", "hex": "<tether's bytes>",
                "expected": <protobuf JSON of the values tether encoded>}, ...],
     "enums": ["UDFWorkerDataFormat", ...]}

For each case, with the classes generated from the official .proto files (udf_protos.py):

  1. tether -> Python: the bytes parse, leave no unknown field anywhere (a wrong field number
     or wire type would), and `json_format.MessageToDict(preserving_proto_field_name=True)`
     of the result equals "expected";
  2. Python -> tether: "expected" is parsed with `json_format.ParseDict` into a fresh message,
     which must equal the decoded one, and is serialized (deterministic) for the Rust side to
     decode ("python_hex").

It also reports which message types of the four files had no "empty" or no "full*" case,
which fields no "full*" case of a type set (so every field and every oneof branch is
covered), and every value of the requested enums. Writes one JSON document on stdout and
exits 0 when every check passed, 1 otherwise (3: environment problem, see udf_protos.py).
"""

import importlib.metadata
import json
import sys

sys.dont_write_bytecode = True  # keep tests/python free of __pycache__

import udf_protos  # noqa: E402

udf_protos.check_requirements()  # before importing the packages it checks

import google.protobuf  # noqa: E402
from google.protobuf import descriptor_pool, json_format, message_factory  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402


def message_types(module):
    """All message types of a generated module, nested ones included, map entries excluded."""
    found = []

    def visit(descriptor):
        if descriptor.GetOptions().map_entry:
            return
        found.append(descriptor)
        for nested in descriptor.nested_types:
            visit(nested)

    for descriptor in module.DESCRIPTOR.message_types_by_name.values():
        visit(descriptor)
    return found


def unknown_fields_present(message):
    """Whether `message` or any message inside it kept fields its schema does not know."""
    clean = type(message)()
    clean.CopyFrom(message)
    clean.DiscardUnknownFields()
    return clean.ByteSize() != message.ByteSize()


def check_case(case, pool):
    name = case["type"]
    result = {"type": name, "case": case["case"], "errors": []}
    errors = result["errors"]
    try:
        cls = message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{udf_protos.PACKAGE}.{name}")
        )
    except KeyError:
        errors.append(f"no message type {name} in the official schema")
        return result, None

    decoded = cls()
    try:
        decoded.ParseFromString(bytes.fromhex(case["hex"]))
    except Exception as e:  # noqa: BLE001 - any parse failure is a finding
        errors.append(f"tether's bytes do not parse: {e!r}")
        return result, None
    if unknown_fields_present(decoded):
        errors.append("tether's bytes carry fields unknown to the official schema")
    as_json = json_format.MessageToDict(decoded, preserving_proto_field_name=True)
    result["decoded"] = as_json
    if as_json != case["expected"]:
        errors.append(
            "decoded values differ: official "
            + json.dumps(as_json, sort_keys=True)
            + " vs tether "
            + json.dumps(case["expected"], sort_keys=True)
        )

    built = cls()
    try:
        json_format.ParseDict(case["expected"], built)
    except json_format.ParseError as e:
        errors.append(f"the expected JSON is not valid for {name}: {e}")
        return result, decoded
    if built != decoded:
        errors.append("the message built from the expected JSON differs from the decoded one")
    result["python_hex"] = built.SerializeToString(deterministic=True).hex()
    return result, decoded


def main():
    protos = udf_protos.load()
    request = json.load(sys.stdin)
    pool = descriptor_pool.Default()

    results = []
    seen = {}  # type -> {"empty": bool, "full": bool, "set": set of field names}
    for case in request["cases"]:
        result, decoded = check_case(case, pool)
        results.append(result)
        entry = seen.setdefault(case["type"], {"empty": False, "full": False, "set": set()})
        if case["case"] == "empty":
            entry["empty"] = True
        if case["case"].startswith("full") and decoded is not None:
            entry["full"] = True
            entry["set"].update(field.name for field, _ in decoded.ListFields())

    missing_types, unset_fields, all_types = [], {}, []
    for module in (protos.common, protos.messages, protos.service, protos.spec):
        for descriptor in message_types(module):
            all_types.append(descriptor.name)
            entry = seen.get(descriptor.name)
            if not entry or not entry["empty"] or not entry["full"]:
                missing_types.append(descriptor.name)
                continue
            unset = sorted(f.name for f in descriptor.fields if f.name not in entry["set"])
            if unset:
                unset_fields[descriptor.name] = unset

    enums = {}
    for name in request.get("enums", []):
        enum = pool.FindEnumTypeByName(f"{udf_protos.PACKAGE}.{name}")
        enums[name] = {value.name: value.number for value in enum.values}

    report = {
        "versions": {
            "protobuf": google.protobuf.__version__,
            "protobuf_backend": api_implementation.Type(),
            "grpcio-tools": importlib.metadata.version("grpcio-tools"),
            "python": sys.version.split()[0],
        },
        "gen_dir": str(protos.gen_dir),
        "schema_types": sorted(all_types),
        "results": results,
        "missing_types": sorted(missing_types),
        "unset_fields": unset_fields,
        "enums": enums,
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    failed = missing_types or unset_fields or any(r["errors"] for r in results)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
