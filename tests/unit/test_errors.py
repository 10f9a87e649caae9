"""One exception tree: every exception class of the package is defined in ``inflight.errors``."""

from __future__ import annotations

import ast
from pathlib import Path

import inflight
from inflight import errors

SRC = Path(inflight.__file__).resolve().parent


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    outside = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, (ast.Name, ast.Attribute)) and ast.unparse(b).endswith(("Error", "Exception"))
                for b in node.bases
            ):
                outside.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert not outside, f"define these in inflight/errors.py: {outside}"


def test_every_error_is_an_inflight_error() -> None:
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    names = {c.__name__ for c in classes}
    assert {"StatsError", "HttpProtocolError", "CuptiUnavailableError", "NsysExportError"} <= names
    assert all(issubclass(c, errors.InflightError) for c in classes)
    # the ValueError callers of nsys-summary keep working
    assert issubclass(errors.NsysExportError, ValueError)
