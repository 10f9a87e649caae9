"""One exception tree: the product's errors in ``inflight.errors``, the tools' in ``inflight.tool_errors``."""

from __future__ import annotations

import ast
from pathlib import Path

import inflight
from inflight import errors, tool_errors

SRC = Path(inflight.__file__).resolve().parent


def test_no_exception_class_is_defined_outside_the_two_error_modules() -> None:
    outside = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name in ("errors.py", "tool_errors.py") and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, (ast.Name, ast.Attribute)) and ast.unparse(b).endswith(("Error", "Exception"))
                for b in node.bases
            ):
                outside.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    assert not outside, f"define these in inflight/errors.py or inflight/tool_errors.py: {outside}"


def test_every_error_is_an_inflight_error() -> None:
    classes = [
        v
        for module in (errors, tool_errors)
        for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, BaseException)
    ]
    names = {c.__name__ for c in classes}
    assert {"ServerError", "StatsError", "HttpProtocolError", "CuptiUnavailableError", "NsysExportError"} <= names
    assert all(issubclass(c, errors.InflightError) for c in classes)
    # the ValueError callers of nsys-summary keep working
    assert issubclass(tool_errors.NsysExportError, ValueError)


def test_the_product_defines_none_of_the_tools_errors() -> None:
    """The backend's exception module holds what the backend raises; the tools' errors live apart."""
    tools = {"ServerError", "StatsError", "HttpProtocolError", "CuptiUnavailableError", "NsysExportError"}
    assert not tools & set(vars(errors)), "tool errors belong in inflight.tool_errors"
