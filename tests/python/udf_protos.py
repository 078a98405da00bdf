"""Official protobuf classes of Spark 4.3.0's UDF-worker protocol, for tether's conformance tests.

The .proto files are never copied into the repository: they are located at run time in the
cache that `scripts/spark-oracle.sh protos` fills (asked with `--cached`, so nothing is
downloaded here; override with the environment variable TETHER_UDF_PROTO_DIR) and compiled with grpcio-tools' bundled protoc
into `target/py-gen/<hash>/`, where <hash> covers the .proto contents and the grpcio-tools
version. Generation is cached, atomic (built in a temporary directory, then renamed) and safe
when several test processes race.

Used as a module by proto_check.py and grpc_peer.py (`load()`), and as a script by
scripts/python-env.sh:

    python tests/python/udf_protos.py --generate    # generate (or reuse) and print the dir

Environment problems (a package version differing from requirements.txt, no protos, protoc
failing) exit with status 3 and a message starting with "ENV:", which the Rust tests turn
into a loud skip (or a failure under CI=true).
"""

import hashlib
import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"
PROTO_FILES = ("common.proto", "udf_message.proto", "udf_service.proto", "worker_spec.proto")
PACKAGE = "org.apache.spark.udf.worker"
ENV_ERROR = 3


def env_error(message):
    """Exits with the environment-problem status (see the module docs)."""
    print(f"ENV: {message}", file=sys.stderr, flush=True)
    sys.exit(ENV_ERROR)


def check_requirements():
    """Every `name==version` line of requirements.txt must be what is installed."""
    problems = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, wanted = line.partition("==")
        try:
            have = importlib.metadata.version(name.strip())
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != wanted.strip():
            problems.append(f"{name.strip()}: want {wanted.strip()}, have {have}")
    if problems:
        env_error(
            "the Python venv does not match tests/python/requirements.txt ("
            + "; ".join(problems)
            + "): run scripts/test.sh or bash scripts/python-env.sh"
        )


def proto_dir():
    """The directory holding the official .proto files (see the module docs)."""
    override = os.environ.get("TETHER_UDF_PROTO_DIR")
    if override:
        path = Path(override)
    else:
        script = REPO / "scripts" / "spark-oracle.sh"
        done = subprocess.run(
            ["bash", str(script), "protos", "--cached"], capture_output=True, text=True
        )
        if done.returncode != 0:
            env_error(f"{script} protos --cached failed ({done.returncode}): {done.stderr.strip()}")
        path = Path(done.stdout.strip())
    missing = [f for f in PROTO_FILES if not (path / f).is_file()]
    if missing:
        env_error(f"{path} lacks {', '.join(missing)}")
    return path


def generate(protos=None, out_root=None):
    """Compiles the .proto files (cached by content hash) and returns the output directory."""
    protos = protos or proto_dir()
    out_root = Path(out_root or REPO / "target" / "py-gen")
    digest = hashlib.sha256()
    digest.update(importlib.metadata.version("grpcio-tools").encode())
    for name in PROTO_FILES:
        digest.update(name.encode() + b"\0" + (protos / name).read_bytes())
    out = out_root / digest.hexdigest()[:16]
    if (out / ".complete").is_file():
        return out
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".gen-", dir=out_root))
    try:
        from grpc_tools import protoc

        well_known = Path(protoc.__file__).resolve().parent / "_proto"
        args = [
            "grpc_tools.protoc",
            f"-I{protos}",
            f"-I{well_known}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            *[str(protos / name) for name in PROTO_FILES],
        ]
        if protoc.main(args) != 0:
            env_error(f"protoc failed on {protos}")
        (tmp / "SOURCE").write_text(f"generated from {protos}\n")
        (tmp / ".complete").write_text("")
        try:
            tmp.rename(out)
        except OSError:
            # Another process finished first: its result is identical.
            if not (out / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load():
    """Checks the venv, generates the classes, imports them: a namespace of the modules."""
    check_requirements()
    gen = generate()
    sys.path.insert(0, str(gen))
    return SimpleNamespace(
        gen_dir=gen,
        common=importlib.import_module("common_pb2"),
        messages=importlib.import_module("udf_message_pb2"),
        service=importlib.import_module("udf_service_pb2"),
        service_grpc=importlib.import_module("udf_service_pb2_grpc"),
        spec=importlib.import_module("worker_spec_pb2"),
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--generate"]:
        sys.exit("usage: udf_protos.py --generate")
    check_requirements()
    print(generate())
