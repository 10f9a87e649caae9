"""``inflight serve``: run tritonserver on the model repository until stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from inflight.cli_util import REPO_DEFAULT, fail, setup_logging
from inflight.errors import InflightError


def serve_cmd(
    repository: Annotated[Path, typer.Option(help="Model repository.")] = REPO_DEFAULT,
    model: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--model",
            "-m",
            help="Models to load (default: all); NAME@key=value,... loads a variant with config overrides, "
            "e.g. bert_tiny_sync@instances=4,delay_us=500; a text ensemble's keys go to its encoder, "
            "tokenizer_instances to its tokenizer (minilm_text@instances=4,tokenizer_instances=8).",
        ),
    ] = None,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    workdir: Annotated[Path, typer.Option(help="Backend folder and server log.")] = Path("runs/serve"),
    tritonserver: Annotated[
        str | None, typer.Option(help="tritonserver binary (default: PATH, then the wheel).")
    ] = None,
    log_verbose: int = 0,
    cpus: Annotated[
        str | None,
        typer.Option(help="Cores for the server and its stubs, as taskset -c takes them (e.g. 0-15); default: all."),
    ] = None,
    exit_timeout: Annotated[
        int | None,
        typer.Option(
            help="Seconds Triton waits at shutdown for open connections and requests in flight "
            "(tritonserver --exit-timeout-secs; default: Triton's 30)."
        ),
    ] = None,
    verbose: bool = False,
) -> None:
    """Start tritonserver with the inflight backend; stop on Ctrl+C / SIGTERM.

    A second Ctrl+C while it stops sends SIGTERM to the server's process group again and SIGKILL
    5 s later; a third kills it at once. Exits 0 after a clean stop, 1 when tritonserver exited on
    its own or uncleanly (the reason is printed), 2 on a bad argument or a failed start.
    """
    _line_buffered_stdout()
    setup_logging(verbose)
    from inflight.loadtest.list_options import parse_cpus
    from inflight.server.config import ServerConfig
    from inflight.server.control import load_config
    from inflight.server.ensemble import load_plan
    from inflight.server.launcher import TritonServer
    from inflight.server.supervise import StopSignals, wait_for_stop
    from inflight.tool_errors import StopRequested

    try:
        server_cpus = tuple(parse_cpus(cpus)) if cpus else ()
    except InflightError as e:
        fail(e)
    overridden = [m for m in model or [] if "@" in m]
    loads: list[tuple[str, str]] = []  # (name, config JSON): a variant, or an ensemble's steps and then itself
    if overridden:
        plain = [m for m in model or [] if "@" not in m]
        try:
            loads = [step for m in overridden for step in load_plan(repository, m)]
        except InflightError as e:
            fail(e)
        model = plain
    cfg = ServerConfig(
        model_repository=repository,
        workdir=workdir,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        models=model,
        tritonserver=tritonserver,
        log_verbose=log_verbose,
        cpus=server_cpus,
        extra_args=(f"--exit-timeout-secs={exit_timeout}",) if exit_timeout is not None else (),
        die_with_launcher=True,
    )
    server = TritonServer(cfg)
    with StopSignals() as stops:

        def stop_server() -> int | None:
            first = stops.count
            return server.stop(more_requests=lambda wait_s: stops.wait(wait_s) - max(first, 1))

        try:
            server.start(stop_requested=lambda: stops.count > 0)
            for name, config_json in loads:
                if stops.count:
                    raise StopRequested(f"stop requested before {name} was loaded")
                seconds = load_config(server.http_url, name, config_json)
                typer.echo(f"loaded {name} with overrides in {seconds:.1f} s")
        except BaseException as e:
            code = stop_server()
            if not isinstance(e, InflightError):
                raise
            if not isinstance(e, StopRequested):
                fail(e)
            typer.echo(f"{e}; tritonserver stopped (exit code {code})")
            _exit_for(server, code)
            raise typer.Exit(0) from None  # a clean stop before serving: never on to the "serving" line
        typer.echo(
            f"serving {repository} (HTTP {server.http_url}, gRPC {server.grpc_url}, metrics {server.metrics_url}); "
            f"log: {server.log_path}; Ctrl+C stops"
        )
        how = "exited"
        try:
            how = wait_for_stop(stops, server.is_alive)
        finally:
            code = stop_server()
        if how == "exited":
            tail = server.log_tail()
            typer.secho(f"tritonserver exited on its own (exit code {code}):\n{tail}", fg=typer.colors.RED, err=True)
            raise typer.Exit(1)
        typer.echo(
            f"tritonserver stopped (exit code {code})"
            + (f": not gracefully: {server.exit_reason}" if server.exit_reason else "")
        )
        _exit_for(server, code)


def _line_buffered_stdout() -> None:
    """Write stdout line by line also into a pipe or file (a supervisor's log sees each line when printed)."""
    import io
    import sys

    if isinstance(sys.stdout, io.TextIOWrapper) and not sys.stdout.line_buffering:
        sys.stdout.reconfigure(line_buffering=True)


def _exit_for(server: Any, code: int | None) -> None:
    """Exit 1, saying why, when tritonserver's exit was not clean; return after a clean one."""
    if code in (0, None):
        return
    typer.secho(
        f"error: tritonserver's exit was not clean (exit code {code}): {server.exit_reason}; its log: "
        f"{server.log_path}",
        fg=typer.colors.RED,
        err=True,
    )
    raise typer.Exit(1)


def balancer_config_cmd(
    upstream: Annotated[
        list[str], typer.Argument(help="The servers' HTTP endpoints, host:port each: one server per GPU, every host's.")
    ],
    listen: Annotated[
        str, typer.Option(help="Where nginx listens, host:port (0.0.0.0:8080 takes requests from other hosts).")
    ] = "127.0.0.1:8080",
    workers: Annotated[int, typer.Option(help="nginx worker processes (each one event loop on one core).")] = 1,
    workdir: Annotated[
        Path, typer.Option(help="Where nginx keeps its pid, error log and temporary files (made here).")
    ] = Path("runs/nginx"),
) -> None:
    """Print the nginx configuration `inflight ab --balancer nginx` runs: round robin over the servers, keep-alive.

    Run it with ``nginx -c "$PWD/nginx.conf"`` (``inflight balancer-config ... > nginx.conf``); clients then send
    Triton's HTTP requests to ``--listen``. Exits 2 on a malformed endpoint.
    """
    from inflight.server.balancer import nginx_config, split_endpoint

    try:
        host, port = split_endpoint(listen, "--listen", "0.0.0.0:8080")
        conf = nginx_config(upstream, port, workdir.resolve(), workers=workers, host=host)
    except InflightError as e:
        fail(e)
    workdir.mkdir(parents=True, exist_ok=True)
    typer.echo(conf, nl=False)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``balancer-config`` to ``app`` (the ``inflight`` command line)."""
    app.command("serve")(serve_cmd)
    app.command("balancer-config")(balancer_config_cmd)
