"""One schemathesis fuzzing worker: ``python -m tests.fuzz_client URL N SEED OUT.json``.

Reads the live server's ``/openapi.json``, generates ``N`` requests over every operation
(schema-conforming and schema-violating halves, from Hypothesis with a fixed seed), sends each
one, checks the answer against the document (status code documented, content type, response
schema, never a 5xx) and writes a status histogram and the failures as JSON. The test runs
two of these side by side (hypothesis generation is CPU-bound and single-threaded)."""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def fuzz(url: str, n: int, rng_seed: int) -> dict[str, Any]:
    key = os.environ.get("ZOO_FUZZ_API_KEY")  # the server's API key: every request sends it
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=auth)
    operations = [op.ok() for op in schema.get_all_operations()]
    modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    # Endpoints with a body get valid and invalid requests; the GET endpoints, whose only
    # freedom is the model name (a wrong one is a 404, tested by hand), get their valid ones,
    # so the budget goes to the bodies.
    strategy = st.one_of(
        [
            op.as_strategy(generation_mode=m)
            for op in operations
            for m in (modes if op.body else modes[:1])
        ]
    )
    statuses: collections.Counter[str] = collections.Counter()
    per_operation: collections.Counter[str] = collections.Counter()
    failures: list[dict[str, Any]] = []
    session = requests.Session()

    @seed(rng_seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=strategy)
    def one(case: schemathesis.Case) -> None:
        where = f"{case.method} {case.path}"
        try:
            response = case.call(base_url=url, session=session, timeout=120, headers=auth)
        except requests.RequestException as exc:  # a dropped connection is a failure too
            statuses["transport-error"] += 1
            failures.append({"operation": where, "error": repr(exc)[:500]})
            return
        statuses[str(response.status_code)] += 1
        per_operation[f"{where} {response.status_code}"] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except Exception as exc:  # schemathesis raises a group of check failures
            failures.append(
                {
                    "operation": where,
                    "status": response.status_code,
                    "failure": str(exc)[:800],
                    "curl": case.as_curl_command()[:800],
                }
            )

    t0 = time.perf_counter()
    one()
    return {
        "seed": rng_seed,
        "requests": sum(statuses.values()),
        "seconds": round(time.perf_counter() - t0, 1),
        "statuses": dict(statuses),
        "per_operation": dict(per_operation),
        "failures": failures,
    }


if __name__ == "__main__":
    url_, n_, seed_, out_ = sys.argv[1:5]
    Path(out_).write_text(json.dumps(fuzz(url_, int(n_), int(seed_)), indent=1))
