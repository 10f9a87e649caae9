"""Typer commands of the profiling tools; ``register(app)`` adds them to ``inflight``.

* ``inflight nsys-summary FILE.sqlite [...] --out DIR`` -- figures, verdict, timelines.
* ``inflight nsys-profile --out DIR --server CMD --load CMD`` -- runs ``scripts/nsys_profile.sh``.
* ``inflight cupti-trace SCRIPT [ARGS...] --out trace.json`` -- runs a Python script in this
  process under CUPTI and writes a Perfetto trace plus the figures.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer

from inflight.cli_util import fail, setup_logging

LOGGER = logging.getLogger(__name__)

#: Where ``scripts/nsys_profile.sh`` lives in a source checkout (override: INFLIGHT_NSYS_PROFILE_SH).
DEFAULT_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "nsys_profile.sh"


def nsys_profile_script() -> Path:
    """Path of ``nsys_profile.sh``.

    Raises:
        FileNotFoundError: when neither the checkout nor ``INFLIGHT_NSYS_PROFILE_SH`` has it.
    """
    p = Path(os.environ.get("INFLIGHT_NSYS_PROFILE_SH", DEFAULT_SCRIPT))
    if not p.is_file():
        raise FileNotFoundError(
            f"{p} not found: nsys_profile.sh ships in the source tree (scripts/); run from a checkout "
            "or set INFLIGHT_NSYS_PROFILE_SH=/path/to/nsys_profile.sh"
        )
    return p


def nsys_profile_argv(
    *,
    out: Path,
    server: str,
    load: str | None = None,
    delay_s: float = 10.0,
    window_s: float = 5.0,
    mode: str = "profile",
    startup_s: float = 30.0,
    graph_trace: str | None = None,
    ready_url: str | None = None,
    name: str = "profile",
    trace: str = "cuda,nvtx,osrt",
    wait_load: bool = False,
    stats: bool = True,
    summary: bool = True,
    nsys_args: Sequence[str] = (),
    metrics_url: str | None = None,
    metrics_every_s: float = 1.0,
) -> list[str]:
    """The command line of ``nsys_profile.sh`` for these settings (see its ``--help``).

    Returns:
        ``[bash, script, options...]``.
    """
    argv = [
        "bash",
        str(nsys_profile_script()),
        "--out",
        str(out),
        "--server",
        server,
        "--delay",
        f"{delay_s:g}",
        "--window",
        f"{window_s:g}",
        "--mode",
        mode,
        "--startup",
        f"{startup_s:g}",
        "--name",
        name,
        "--trace",
        trace,
    ]
    if load:
        argv += ["--load", load]
    if graph_trace:
        argv += ["--graph-trace", graph_trace]
    if ready_url:
        argv += ["--ready-url", ready_url]
    if wait_load:
        argv.append("--wait-load")
    if not stats:
        argv.append("--no-stats")
    if not summary:
        argv.append("--no-summary")
    for a in nsys_args:
        argv += ["--nsys-arg", a]
    if metrics_url:
        argv += ["--metrics-url", metrics_url, "--metrics-every", f"{metrics_every_s:g}"]
    return argv


def run_nsys_profile(*, out: Path, env: dict[str, str] | None = None, **kwargs: object) -> Path:
    """Profile a server under load with ``nsys_profile.sh``; for Python drivers.

    Args:
        out: Output folder.
        env: Environment for the script (default: this process's; ``PYTHON`` is set to this
            interpreter so the summary uses the same ``inflight``).
        **kwargs: :func:`nsys_profile_argv` options (``server`` is required).

    Returns:
        The sqlite export (``out/<name>.sqlite``).

    Raises:
        RuntimeError: when the script fails (its message is in the exception).
    """
    argv = nsys_profile_argv(out=out, **kwargs)  # type: ignore[arg-type]
    environment = dict(os.environ if env is None else env)
    environment.setdefault("PYTHON", sys.executable)
    LOGGER.info("running %s", " ".join(argv[:2]))
    proc = subprocess.run(argv, env=environment, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"nsys_profile.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(out) / f"{kwargs.get('name', 'profile')}.sqlite"


def nsys_summary_cmd(
    files: Annotated[list[Path], typer.Argument(help="nsys sqlite exports (nsys export --type sqlite).")],
    out: Annotated[Optional[Path], typer.Option(help="Write summary.md, summary.json and timeline PNGs here.")] = None,  # noqa: UP045
    label: Annotated[Optional[list[str]], typer.Option(help="Column title, once per file.")] = None,  # noqa: UP045
    window_start: Annotated[Optional[int], typer.Option(help="Window start, ns on the report timeline.")] = None,  # noqa: UP045
    window_end: Annotated[Optional[int], typer.Option(help="Window end, ns.")] = None,  # noqa: UP045
    nvtx: Annotated[Optional[str], typer.Option(help="Use the span of the NVTX range(s) with this name.")] = None,  # noqa: UP045
    device: Annotated[Optional[int], typer.Option(help="Only this GPU (deviceId).")] = None,  # noqa: UP045
    timeline_ms: Annotated[float, typer.Option(help="Timeline PNG length in ms (0: none).")] = 5.0,
    timeline_at: Annotated[Optional[int], typer.Option(help="Timeline start, ns (default: mid-window).")] = None,  # noqa: UP045
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of Markdown.")] = False,
    busy: Annotated[float, typer.Option(help="GPU activity counted as 'no idle gaps'.")] = 0.90,
    sync_high: Annotated[float, typer.Option(help="Sync share counted as high.")] = 0.50,
    launch_high: Annotated[float, typer.Option(help="Launch share counted as high.")] = 0.30,
    short_dispatch_us: Annotated[float, typer.Option(help="Median dispatch below this is short (µs).")] = 100.0,
    verbose: bool = False,
) -> None:
    """GPU activity (union/wall), sync share, dispatches and the regime, side by side per file."""
    setup_logging(verbose)
    from inflight.profiling.nsys_summary import run, to_json, to_markdown
    from inflight.profiling.regime import Thresholds
    from inflight.tool_errors import NsysExportError

    try:
        summaries = run(
            files,
            out=out,
            labels=label,
            window_start=window_start,
            window_end=window_end,
            nvtx=nvtx,
            device=device,
            thresholds=Thresholds(busy, sync_high, launch_high, short_dispatch_us),
            timeline_ms=timeline_ms,
            timeline_at=timeline_at,
        )
    except (NsysExportError, ValueError) as e:
        fail(str(e))
    typer.echo(to_json(summaries) if as_json else to_markdown(summaries))


def nsys_summary_main(argv: Sequence[str] | None = None) -> int:
    """``inflight nsys-summary`` standalone (``scripts/nsys_summary.py``): the same command line.

    Returns the exit status (2 for a file that is not a usable export or a bad option).
    """
    from typer.main import get_command

    app = typer.Typer(add_completion=False)
    app.command()(nsys_summary_cmd)
    try:  # standalone: usage errors print as on the command line (exit 2), typer.Exit gives its code
        get_command(app).main(args=list(argv) if argv is not None else None, prog_name="nsys_summary")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def nsys_trim_cmd(
    src: Annotated[Path, typer.Argument(help="An nsys sqlite export.")],
    dst: Annotated[Path, typer.Argument(help="Where to write the trimmed copy.")],
    keep_ms: Annotated[float, typer.Option(help="Window kept, ms.")] = 200.0,
    skip_ms: Annotated[float, typer.Option(help="Start this long after the first GPU activity, ms.")] = 0.0,
    verbose: bool = False,
) -> None:
    """Cut an export down to the tables nsys-summary reads over a short window (for fixtures, bug reports)."""
    setup_logging(verbose)
    from inflight.profiling.nsys_trim import trim

    try:
        kept = trim(src, dst, keep_ms=keep_ms, skip_ms=skip_ms)
    except (ValueError, OSError) as e:
        fail(str(e))
    typer.echo(f"{dst}: {dst.stat().st_size:,} bytes; rows kept: {kept}")


def nsys_profile_cmd(
    out: Annotated[Path, typer.Option(help="Output folder.")],
    server: Annotated[str, typer.Option(help="Command to profile (bash -c), e.g. a tritonserver command line.")],
    load: Annotated[Optional[str], typer.Option(help="Load command (bash -c), run once ready.")] = None,  # noqa: UP045
    delay: Annotated[float, typer.Option(help="Seconds of load before the capture.")] = 10.0,
    window: Annotated[float, typer.Option(help="Capture length, seconds.")] = 5.0,
    mode: Annotated[
        str, typer.Option(help="profile (nsys profile --delay/--duration) or launch (launch/start/stop).")
    ] = "profile",
    startup: Annotated[float, typer.Option(help="(profile mode) seconds allowed for server startup.")] = 30.0,
    graph_trace: Annotated[Optional[str], typer.Option(help="--cuda-graph-trace: graph or node.")] = None,  # noqa: UP045
    ready_url: Annotated[Optional[str], typer.Option(help="Readiness URL ('none' to skip).")] = None,  # noqa: UP045
    name: Annotated[str, typer.Option(help="Report base name.")] = "profile",
    wait_load: Annotated[bool, typer.Option(help="Wait for the load command instead of stopping it.")] = False,
    metrics_url: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="(launch mode) Prometheus endpoint scraped during the capture, e.g. http://localhost:8002/metrics."
        ),
    ] = None,
    metrics_every: Annotated[float, typer.Option(help="Seconds between metric scrapes.")] = 1.0,
) -> None:
    """Profile a server under load with Nsight Systems (scripts/nsys_profile.sh)."""
    try:
        argv = nsys_profile_argv(
            out=out,
            server=server,
            load=load,
            delay_s=delay,
            window_s=window,
            mode=mode,
            startup_s=startup,
            graph_trace=graph_trace,
            ready_url=ready_url,
            name=name,
            wait_load=wait_load,
            metrics_url=metrics_url,
            metrics_every_s=metrics_every,
        )
    except FileNotFoundError as e:
        fail(str(e))
    env = dict(os.environ)
    env.setdefault("PYTHON", sys.executable)
    code = subprocess.call(argv, env=env)
    if code != 0:
        raise typer.Exit(code)


def cupti_trace_cmd(
    script: Annotated[Path, typer.Argument(help="Python script to run in this process.")],
    args: Annotated[Optional[list[str]], typer.Argument(help="Its arguments.")] = None,  # noqa: UP045
    out: Annotated[Path, typer.Option(help="Trace JSON (Perfetto / chrome://tracing).")] = Path("trace.json"),
    markers: Annotated[bool, typer.Option(help="Record NVTX ranges (needs NVTX_INJECTION64_PATH=libcupti).")] = False,
    graph_trace: Annotated[bool, typer.Option(help="Record whole CUDA graphs instead of their kernels.")] = False,
    verbose: bool = False,
) -> None:
    """Run SCRIPT under CUPTI, write a Perfetto trace and print the figures as JSON."""
    setup_logging(verbose)
    from inflight.profiling.cupti_live import CuptiWindow
    from inflight.tool_errors import CuptiUnavailableError

    if not script.is_file():
        fail(f"{script}: no such file")
    sys.argv = [str(script), *(args or [])]
    try:
        with CuptiWindow(markers=markers, graph_trace=graph_trace) as w:
            runpy.run_path(str(script), run_name="__main__")
    except CuptiUnavailableError as e:
        fail(str(e))
    path = w.write_trace(out)
    summary = w.summary().to_dict()
    summary["sync_calls_by_thread"] = {str(k): v for k, v in w.sync_calls_by_thread().items()}
    summary["trace"] = str(path)
    typer.echo(json.dumps(summary, indent=2, default=str))


def register(app: typer.Typer) -> None:
    """Add the profiling commands to the ``inflight`` typer app.

    Args:
        app: The application (``inflight.cli.app``).
    """
    app.command("nsys-summary")(nsys_summary_cmd)
    app.command("nsys-profile")(nsys_profile_cmd)
    app.command("nsys-trim")(nsys_trim_cmd)
    app.command(
        "cupti-trace",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(cupti_trace_cmd)
