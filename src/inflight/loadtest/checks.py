"""How the load test checks what comes back: every output of an answer, its failure's status.

An answer is checked for its outputs' names, datatypes and shapes and, when the pool holds
references, for its values within the model's tolerance (:func:`inflight.loadtest.workload.tolerance_for`).
A failure message says what was wrong; :func:`failure_status` reads the refusal it reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from inflight.loadtest.workload import DEFAULT_TOLERANCE, Tolerance
from inflight.models.spec import ModelSpec

if TYPE_CHECKING:
    pass


def check_output(
    spec: ModelSpec,
    items: int,
    get: Callable[[str], tuple[np.ndarray | None, str | None]],
    available: Callable[[], Sequence[str]],
    reference: Mapping[str, np.ndarray] | None = None,
    tol: Tolerance | None = None,
) -> str | None:
    """Check every output of one response; return a failure message or None.

    Args:
        spec: The model.
        items: Items sent in the request.
        get: Returns ``(array, wire datatype)`` of an output, ``(None, None)`` when absent.
        available: Names of the outputs the response carries (for the message).
        reference: Expected values per output (``--check``), or None.
        tol: Tolerance for ``reference``.
    """
    for t in spec.outputs:
        a, datatype = get(t.name)
        if a is None:
            return f"output {t.name!r} missing from the response (it has {list(available())})"
        if datatype != t.wire_type or a.dtype != np.dtype(t.dtype):
            return f"output {t.name!r} has datatype {datatype} ({a.dtype}); expected {t.wire_type}"
        want = t.shape(items, None) if not t.variable else None
        if want is not None and tuple(a.shape) != want:
            return f"output {t.name!r} has shape {list(a.shape)}; expected {list(want)}"
        if reference is not None:
            msg = compare(a, reference[t.name], tol or DEFAULT_TOLERANCE)
            if msg:
                return f"output {t.name!r} differs from the PyTorch reference: {msg}"
    return None


_REFUSAL = re.compile(r"^(HTTP \d{3}|gRPC [A-Z_]+):")

OTHER_FAILURE = "other"
"""``failure_status`` of a failure that is no refusal: no answer, a timeout, a connection error, a wrong output."""


def failure_status(message: str) -> str:
    """The refusal a failure message reports: ``HTTP 400``, ``gRPC INVALID_ARGUMENT``, or ``other``.

    Reads the messages ``check_http_body`` and the Locust gRPC user write (``HTTP 400: ...``,
    ``gRPC INVALID_ARGUMENT: ...``); anything else (no answer, connection errors, timeouts, wrong or
    undecodable outputs) is ``OTHER_FAILURE``.
    """
    m = _REFUSAL.match(message)
    return m.group(1) if m else OTHER_FAILURE


def failures_by_status(counts: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Failures per ``failure_status`` from (message, occurrences) pairs, the most frequent first."""
    out: dict[str, int] = {}
    for message, n in counts:
        key = failure_status(message)
        out[key] = out.get(key, 0) + int(n)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def check_http_body(
    spec: ModelSpec,
    items: int,
    status: int,
    header: Callable[[str], str | None],
    content: bytes,
    reference: Mapping[str, np.ndarray] | None = None,
    tol: Tolerance | None = None,
) -> str | None:
    """Check one HTTP answer: its status, then the decoded KServe v2 body; a failure message or None.

    Args:
        spec: The model.
        items: Items sent in the request.
        status: HTTP status code.
        header: Reads a response header by name (None when absent).
        content: The response body.
        reference: Expected values per output, or None.
        tol: Tolerance for ``reference``.
    """
    import tritonclient.http as httpclient

    if status != 200:
        try:
            detail = json.loads(content).get("error", content[:200])
        except ValueError:
            detail = content[:200]
        hint = " (is the model loaded under this name? see --model)" if status == 404 else ""
        return f"HTTP {status}: {detail}{hint}"
    header_length = header("Inference-Header-Content-Length")
    try:
        result = httpclient.InferenceServerClient.parse_response_body(
            content,
            header_length=int(header_length) if header_length is not None else None,
            content_encoding=header("Content-Encoding"),
        )
    except Exception as e:  # a malformed body is a failed request, whatever the decoder raised
        return f"undecodable response ({type(e).__name__}: {e})"

    def get(name: str) -> tuple[np.ndarray | None, str | None]:
        out = result.get_output(name)
        if out is None:
            return None, None
        return result.as_numpy(name), out.get("datatype")

    def available() -> list[str]:
        return [o.get("name") for o in result.get_response().get("outputs", [])]

    return check_output(spec, items, get, available, reference, tol)


def check_grpc_response(
    spec: ModelSpec,
    items: int,
    response: Any,
    reference: Mapping[str, np.ndarray] | None = None,
    tol: Tolerance | None = None,
) -> str | None:
    """Check one gRPC ``ModelInferResponse`` message; a failure message or None.

    Args:
        spec: The model.
        items: Items sent in the request.
        response: The ``ModelInferResponse``.
        reference: Expected values per output, or None.
        tol: Tolerance for ``reference``.
    """
    from tritonclient.grpc import InferResult

    try:
        result = InferResult(response)
    except Exception as e:  # a malformed message is a failed request, whatever the decoder raised
        return f"undecodable response ({type(e).__name__}: {e})"

    def get(name: str) -> tuple[np.ndarray | None, str | None]:
        for o in response.outputs:
            if o.name == name:
                return result.as_numpy(name), o.datatype
        return None, None

    def available() -> list[str]:
        return [o.name for o in response.outputs]

    return check_output(spec, items, get, available, reference, tol)


def check_grpc_body(
    spec: ModelSpec,
    items: int,
    content: bytes,
    reference: Mapping[str, np.ndarray] | None = None,
    tol: Tolerance | None = None,
) -> str | None:
    """Check one serialized gRPC ``ModelInferResponse`` (:func:`check_grpc_response` once decoded)."""
    from tritonclient.grpc import service_pb2

    try:
        response = service_pb2.ModelInferResponse.FromString(content)
    except Exception as e:  # a malformed message is a failed request, whatever the decoder raised
        return f"undecodable response ({type(e).__name__}: {e})"
    return check_grpc_response(spec, items, response, reference, tol)


def compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> str | None:
    """Compare with ``tol``; return None when close, else where and by how much it differs."""
    if not np.isfinite(actual).all():
        return "the output contains NaN or Inf"
    ref = expected.astype(np.float64)
    diff = np.abs(actual.astype(np.float64) - ref)
    atol = tol.atol * (float(np.abs(ref).max()) if tol.scale_by_max else 1.0)
    bad = diff > atol + tol.rtol * np.abs(ref)
    if not bad.any():
        return None
    idx = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), diff.shape)
    return (
        f"{int(bad.sum())} of {bad.size} values outside rtol={tol.rtol:g} atol={atol:.3g}; worst at "
        f"{list(map(int, idx))}: got {float(actual[idx]):.6g}, expected {float(expected[idx]):.6g}"
    )
