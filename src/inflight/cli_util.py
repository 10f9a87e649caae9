"""Helpers shared by the typer commands of ``inflight``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import NoReturn

import typer

REPO_DEFAULT = Path("model_repository")
"""The model repository the commands read and write unless ``--repository`` says otherwise."""


def setup_logging(verbose: bool) -> None:
    """Log to stderr, INFO (DEBUG when ``verbose``), with quiet exporters."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("onnx_ir", "onnxscript", "torch.onnx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print ``error: ...`` in red to stderr and exit with ``code``."""
    typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)
