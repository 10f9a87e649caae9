"""The ``inflight`` command line (typer).

One application, ``app``; each command group adds its commands to it (``register``), in the order
``inflight --help`` lists them: the model commands (``inflight.cli.models``), ``serve``
(``inflight.cli.serve``), the measurement commands (``inflight.cli.measure``), then the load
test's (``inflight.loadtest.cli``) and the profiler's (``inflight.profiling.cli``).
"""

from __future__ import annotations

import typer

from inflight.cli import measure, models, serve

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="inflight: serve small models on Triton with several batches in flight, and measure it.",
)


def _register_subcommands() -> None:
    from inflight.loadtest.cli import register as register_ab
    from inflight.profiling.cli import register as register_profiling

    models.register(app)
    serve.register(app)
    measure.register(app)
    register_ab(app)
    register_profiling(app)


_register_subcommands()


def main() -> None:
    """Entry point of the ``inflight`` script."""
    app()
