"""The server's OpenAPI 3.1 description (``GET /openapi.json``): every endpoint, every status it
answers, and the v2 request/response schemas generated from the msgspec types that validate
them, so the document cannot drift from the validator. Fuzzers (schemathesis) read it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from zoo.calibration import SCORE_KINDS
from zoo.deploy.serve.protocol import (
    HEADER,
    MAX_RANK,
    InferenceRequest,
    InferenceResponse,
    ModelMetadata,
    TritonConfig,
)

_REF = "#/components/schemas/{name}"
_BINARY = {"type": "string", "format": "binary"}


def _obj(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: "the request breaks the protocol or the model's input contract (message names the field)",
        404: "no model of that name here",
        413: "body, tensor or decoded image over the limit",
        415: "a Content-Encoding the server does not read",
        429: "queue full; retry after Retry-After seconds",
        503: "the model is not ready yet (loading or warming up)",
        504: "the request waited longer than --timeout-ms",
        401: "no API key, or not one of this server's (WWW-Authenticate: Bearer)",
        403: "the API key lacks this endpoint's scope",
    }
    ref = {"$ref": _REF.format(name="Error")}
    return {str(c): _json(ref, why[c]) for c in codes}


def openapi_document(
    model_name: str | Sequence[str], keyed: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server serving ``model_name``.

    Args:
        model_name: the model this server serves, or its models (the valid ``{name}``s).
        keyed: path → the API-key scope it needs, when the server has keys (those operations
            then declare bearer security and their 401 and 403 answers).

    Returns:
        A JSON-ready dict.
    """
    _, components = msgspec.json.schema_components(
        [InferenceRequest, InferenceResponse, ModelMetadata, TritonConfig], ref_template=_REF
    )
    scalar = {"type": ["boolean", "number", "string"]}  # the protocol's $parameter_value
    for params in ("InputParameters", "OutputParameters", "RequestParameters"):
        components[params]["additionalProperties"] = scalar
    # The validator also takes the nested form of ``data`` (up to MAX_RANK deep); the document
    # shows the flat form every client sends, which keeps generated requests cheap to build.
    components["InputTensor"]["properties"]["data"] = {
        "anyOf": [
            {"type": "array", "items": {"type": ["number", "boolean"]}},
            {"type": "null"},
        ],
        "description": f"row-major values; the nested form (at most {MAX_RANK} deep) works too",
    }
    for informational in ("model_name", "model_version"):  # as KServe: the URL decides
        components["InferenceRequest"]["properties"][informational]["description"] = (
            "accepted for KServe's and Triton's clients; the URL names the model"
        )
    components["Error"] = _obj(error={"type": "string"})
    components["PredictResponse"] = _obj(
        model_name={"type": "string"},
        predictions={
            "type": "array",
            "items": _obj(
                label={"type": "string"}, index={"type": "integer"}, score={"type": "number"}
            ),
        },
    )
    # a model with a rejection rule (zoo finetune/calibrate --reject) adds its verdict
    components["PredictResponse"]["properties"].update(
        label={"type": "string", "description": "the answer: the best class, or 'unknown'"},
        accepted={"type": "boolean", "description": "false: the rule answers 'unknown'"},
        score={"type": "number", "description": "the image's score of the rule"},
        score_kind={"type": "string", "enum": list(SCORE_KINDS)},
        threshold={"type": "number", "description": "images scoring below it are rejected"},
    )
    # a multi-label model (zoo finetune --multi-label) adds its decided classes
    components["PredictResponse"]["properties"]["labels"] = {
        "type": "array",
        "items": {"type": "string"},
        "description": "multi-label: every class whose score reaches its threshold (the "
        "metadata's parameters.thresholds), in class order",
    }
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "enum": names},
    }
    infer = {
        "summary": "KServe v2 inference: JSON tensors, or the binary-tensor extension",
        "parameters": [
            name,
            {
                "name": HEADER,
                "in": "header",
                "required": False,
                "description": "binary extension: bytes of JSON before the binary tensors",
                "schema": {"type": "integer", "minimum": 1},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": _REF.format(name="InferenceRequest")}},
                "application/octet-stream": {"schema": _BINARY},
            },
        },
        "responses": {
            "200": {
                "description": "the outputs (binary ones after the JSON header); a model "
                "with a rejection rule adds 'accepted' (BOOL [N]) and 'score' (FP32 [N]) after "
                "the logits, a multi-label model 'labels' (BYTES [N]: the classes over their "
                "thresholds, joined by ';'), declared in its metadata",
                "content": {
                    "application/json": {"schema": {"$ref": _REF.format(name="InferenceResponse")}},
                    "application/octet-stream": {"schema": _BINARY},
                },
            },
            **_errors(400, 404, 413, 415, 429, 503, 504),
        },
    }
    predict = {
        "summary": "An image in (raw body or multipart field 'file'), top-k labels out",
        "parameters": [
            name,
            {
                "name": "top_k",
                "in": "query",
                "required": False,
                "schema": {"type": "integer", "minimum": 1},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "image/jpeg": {"schema": _BINARY},
                "image/png": {"schema": _BINARY},
                "application/octet-stream": {"schema": _BINARY},
                "multipart/form-data": {"schema": _obj(file=_BINARY)},
            },
        },
        "responses": {
            "200": _json({"$ref": _REF.format(name="PredictResponse")}, "top-k predictions"),
            **_errors(400, 404, 413, 415, 429, 503, 504),
        },
    }
    meta = {
        "summary": "Model metadata: inputs, outputs, classes, preprocessing",
        "parameters": [name],
        "responses": {
            "200": _json({"$ref": _REF.format(name="ModelMetadata")}, "the model's metadata"),
            **_errors(404, 503),
        },
    }
    config = {
        "summary": "Model configuration as Triton answers it (max_batch_size, input format)",
        "parameters": [name],
        "responses": {
            "200": _json({"$ref": _REF.format(name="TritonConfig")}, "the model's configuration"),
            **_errors(404, 503),
        },
    }
    ready = {
        "summary": "Model readiness (after warm-up)",
        "parameters": [name],
        "responses": {
            "200": _json(_obj(name={"type": "string"}, ready={"type": "boolean"}), "ready"),
            **_errors(404, 503),
        },
    }
    readiness = _obj(ready={"type": "boolean"})
    entry = _obj(
        name={"type": "string"},
        version={"type": "string"},
        state={"type": "string", "enum": ["READY", "LOADING", "UNAVAILABLE"]},
    )
    entry["properties"]["reason"] = {"type": "string", "description": "why UNAVAILABLE"}
    index = {
        "summary": "The models served, their versions and states (model repository extension)",
        "responses": {
            "200": _json({"type": "array", "items": entry}, "one entry a model"),
            **_errors(400, 413, 415),
        },
    }
    index_post = {
        **index,
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {"ready": {"type": "boolean"}},
                        "additionalProperties": False,
                        "description": "ready: true lists only the ready models",
                    }
                }
            },
        },
    }
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "zoo serve",
            "version": "1",
            "description": f"Serving {', '.join(names)}",
        },
        "paths": {
            "/": {
                "get": {
                    "summary": "Demo page: drop an image, see the top labels",
                    "responses": {
                        "200": {
                            "description": "an HTML page (no external resources)",
                            "content": {"text/html": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/v2": {
                "get": {
                    "summary": "Server metadata (Open Inference Protocol v2)",
                    "responses": {
                        "200": _json(
                            _obj(
                                name={"type": "string"},
                                version={"type": "string"},
                                extensions={"type": "array", "items": {"type": "string"}},
                            ),
                            "server metadata",
                        )
                    },
                }
            },
            "/v2/health/live": {
                "get": {
                    "summary": "Liveness",
                    "responses": {"200": _json(_obj(live={"type": "boolean"}), "alive")},
                }
            },
            "/v2/health/ready": {
                "get": {
                    "summary": "Readiness: true only once every model answered its warm-up",
                    "responses": {
                        "200": _json(readiness, "ready"),
                        "503": _json(readiness, "not ready yet"),
                    },
                }
            },
            "/v2/repository/index": {"get": index, "post": index_post},
            "/v2/models/{name}": {"get": meta},
            "/v2/models/{name}/versions/1": {"get": meta},
            "/v2/models/{name}/config": {"get": config},
            "/v2/models/{name}/versions/1/config": {"get": config},
            "/v2/models/{name}/ready": {"get": ready},
            "/v2/models/{name}/infer": {"post": infer},
            "/v2/models/{name}/versions/1/infer": {"post": infer},
            "/v2/models/{name}/predict": {"post": predict},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.1")},
                }
            },
        },
        "components": {"schemas": components},
    }
    if keyed:
        _secure(doc, keyed)
    return doc


def _secure(doc: dict[str, Any], keyed: Mapping[str, str]) -> None:
    """Bearer security (and its 401 and 403) on every operation of a keyed path."""
    doc["components"]["securitySchemes"] = {
        "apiKey": {"type": "http", "scheme": "bearer", "description": "zoo serve's API key"}
    }
    for path, item in doc["paths"].items():
        if path not in keyed:
            continue
        for method, op in item.items():
            item[method] = {
                **op,
                "security": [{"apiKey": []}],
                "description": f"needs an API key with the {keyed[path]!r} scope",
                "responses": {**op["responses"], **_errors(401, 403)},
            }
