"""Message conformance oracle: checks tether's protobuf encoding against the official classes.

Driven by tests/conformance/main.rs, one process for the whole batch. Reads one JSON document
on stdin:

    {"cases": [{"type": "Init", "case": "full", "bytes": "<tether's bytes, base64>",
                "fields": {"<tether's field name>": <value>, ...}}, ...],
     "enums": ["UDFWorkerDataFormat", ...]}

where "fields" holds every field of tether's message in the JSON form described in
tests/conformance/fields.rs (null when not set). For each case, with the classes generated
from the official .proto files (udf_protos.py):

  1. by name: a fresh official message is built from "fields", each value set on the official
     field of the same name (a oneof: on the branch whose name is the Rust variant's in
     snake_case); tether's field names must be exactly the official ones, and each value must
     fit its official field's type;
  2. tether -> Python: tether's bytes parse, leave no unknown field anywhere (a wrong field
     number or wire type would), and equal the message built by name;
  3. Python -> tether: the message built by name is serialized (deterministic) for the Rust
     side to compare with tether's bytes and to decode ("python", base64).

It also reports which message types of the four files had no "empty" or no "full*" case,
which fields no "full*" case of a type set (so every field and every oneof branch is
covered), and every value of the requested enums. Writes one JSON document on stdout and
exits 0 when every check passed, 1 otherwise (3: environment problem, see udf_protos.py).
"""

import base64
import importlib.metadata
import json
import sys

sys.dont_write_bytecode = True  # keep tests/python free of __pycache__

import udf_protos  # noqa: E402

udf_protos.check_requirements()  # before importing the packages it checks

import google.protobuf  # noqa: E402
from google.protobuf import descriptor_pool, json_format, message_factory  # noqa: E402
from google.protobuf.descriptor import FieldDescriptor  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402


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


def is_synthetic(oneof):
    """Whether `oneof` is the synthetic oneof protoc makes for one proto3 `optional` field."""
    return len(oneof.fields) == 1 and oneof.name == "_" + oneof.fields[0].name


def camel(name):
    """A field name as prost names its oneof variant (`unix_domain_socket`: `UnixDomainSocket`)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


INTEGER_TYPES = {
    getattr(FieldDescriptor, f"TYPE_{size}")
    for size in (
        "INT32", "INT64", "UINT32", "UINT64", "SINT32", "SINT64",
        "FIXED32", "FIXED64", "SFIXED32", "SFIXED64", "ENUM",
    )
}

TYPE_NAMES = {
    number: name[len("TYPE_"):].lower()
    for name, number in vars(FieldDescriptor).items()
    if name.startswith("TYPE_")
}


def scalar(field, value):
    """`value` (tether's JSON form) as a Python value for the official scalar `field`."""
    if isinstance(value, bool):
        fits = field.type == FieldDescriptor.TYPE_BOOL
    elif isinstance(value, int):
        fits = field.type in INTEGER_TYPES
    elif isinstance(value, str):
        fits = field.type == FieldDescriptor.TYPE_STRING
    elif isinstance(value, dict) and set(value) == {"bytes"}:
        fits = field.type == FieldDescriptor.TYPE_BYTES
        value = base64.b64decode(value["bytes"], validate=True)
    else:
        fits = False
    if not fits:
        official = TYPE_NAMES[field.type]
        raise TypeError(f"tether's value {value!r} does not fit the official {official}")
    return value


def set_field(message, field, value):
    """Sets the official `field` of `message` to tether's `value` (JSON form)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        if not (isinstance(value, dict) and set(value) == {"map"}):
            raise TypeError(f"tether's value {value!r} for a map")
        entry = field.message_type.fields_by_name
        target = getattr(message, field.name)
        for key, val in value["map"].items():
            target[scalar(entry["key"], key)] = scalar(entry["value"], val)
    elif field.is_repeated:
        if not isinstance(value, list):
            raise TypeError(f"tether's value {value!r} for a repeated field")
        target = getattr(message, field.name)
        for item in value:
            if field.message_type is not None:
                target.add().MergeFromString(message_bytes(item))
            else:
                target.append(scalar(field, item))
    elif field.message_type is not None:
        target = getattr(message, field.name)
        target.SetInParent()
        target.MergeFromString(message_bytes(value))
    else:
        setattr(message, field.name, scalar(field, value))


def message_bytes(value):
    """The encoded message in tether's JSON form of a message value."""
    if not (isinstance(value, dict) and set(value) == {"message"}):
        raise TypeError(f"tether's value {value!r} for a message field")
    return base64.b64decode(value["message"], validate=True)


def build(cls, fields, errors):
    """An official `cls` with tether's field values set by tether's field names."""
    message = cls()
    descriptor = cls.DESCRIPTOR
    oneofs = {o.name: o for o in descriptor.oneofs if not is_synthetic(o)}
    official = {
        f.name
        for f in descriptor.fields
        if f.containing_oneof is None or is_synthetic(f.containing_oneof)
    } | set(oneofs)
    if set(fields) != official:
        errors.append(
            f"tether's fields {sorted(fields)} are not the official ones {sorted(official)}"
        )
    for name, value in fields.items():
        if value is None:
            continue
        if name in oneofs:
            branch = value.get("oneof") if isinstance(value, dict) else None
            field = next((f for f in oneofs[name].fields if camel(f.name) == branch), None)
            if field is None:
                errors.append(f"{name}: no official branch named like tether's {branch!r}")
                continue
            value = value["value"]
        else:
            field = descriptor.fields_by_name.get(name)
            if field is None:
                continue  # reported above
        try:
            set_field(message, field, value)
        except (TypeError, ValueError, DecodeError) as e:
            errors.append(f"{name}: {e}")
    return message


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

    built = build(cls, case["fields"], errors)
    result["python"] = base64.b64encode(built.SerializeToString(deterministic=True)).decode()

    decoded = cls()
    try:
        decoded.ParseFromString(base64.b64decode(case["bytes"], validate=True))
    except Exception as e:  # noqa: BLE001 - any parse failure is a finding
        errors.append(f"tether's bytes do not parse: {e!r}")
        return result, None
    if unknown_fields_present(decoded):
        errors.append("tether's bytes carry fields unknown to the official schema")
    if decoded != built:
        errors.append(
            "the official decoder reads tether's bytes as "
            + shown(decoded)
            + ", built by name from tether's values: "
            + shown(built)
        )
    return result, decoded


def shown(message):
    return json.dumps(
        json_format.MessageToDict(message, preserving_proto_field_name=True), sort_keys=True
    )


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
