"""The environment every script that runs pyspark-client starts with (imported first).

- The client reads a token and a default remote from the environment when the connection
  string has none (connect §4); the tests set both explicitly, so they are removed here.
- `require()` imports pyspark-client's modules; when that fails the script exits with status
  3 and a message starting with "ENV:", which the Rust tests report as an environment
  problem (SKIPPED, or a failure under CI=true), not as a failed check.
"""

import importlib
import os
import sys

ENV_ERROR = 3

os.environ.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
os.environ.pop("SPARK_REMOTE", None)


def require(*modules):
    """The modules named, imported; exits with ENV_ERROR when one cannot be."""
    try:
        return [importlib.import_module(m) for m in modules]
    except Exception as e:  # noqa: BLE001 - any import problem is an environment problem
        print(f"ENV: pyspark-client cannot be imported: {e!r}", file=sys.stderr, flush=True)
        sys.exit(ENV_ERROR)
