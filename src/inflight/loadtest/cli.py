"""``inflight ab`` and ``inflight ab-report`` (typer); ``register(app)`` adds them to a Typer app.

Also runnable on its own: ``python -m inflight.loadtest.cli ab ...``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from inflight.cli_util import fail, setup_logging
from inflight.errors import InflightError

LOGGER = logging.getLogger(__name__)


def ab_cmd(
    variants: Annotated[
        list[str],
        typer.Argument(
            help="Variants to compare, first = A: name[@key=value,...], e.g. "
            "bert_tiny_sync@instances=4,delay_us=500 bert_tiny_inflight@slots=4. Keys: instances, kind, delay_us, "
            "preferred (512/1024), graphs, name, or any backend parameter; with --server-per-gpu also via= "
            "(balancer, direct or gpu<N>: where the load goes) and rates= (its own --rate, e.g. 20k/40k). "
            "A text ensemble (NAME_text, with --token-dist text) takes its encoder's keys, tokenizer_instances and "
            "encoder= (another model in the encoder's place: NAME_text@encoder=NAME_null is the text path's bound).",
        ),
    ],
    preset: Annotated[
        str, typer.Option(help="Load shape: smoke (20 users, 10 s) or published (1000 users, 120 s).")
    ] = "smoke",
    window: Annotated[Optional[float], typer.Option(help="Measured seconds per variant (preset's by default).")] = None,  # noqa: UP045
    warmup: Annotated[Optional[float], typer.Option(help="Warm-up seconds before each window.")] = None,  # noqa: UP045
    users: Annotated[Optional[int], typer.Option(help="Concurrent closed-loop users.")] = None,  # noqa: UP045
    spawn_rate: Annotated[Optional[float], typer.Option(help="Users started per second.")] = None,  # noqa: UP045
    items: Annotated[Optional[int], typer.Option(help="Items per request.")] = None,  # noqa: UP045
    seq_len: Annotated[Optional[int], typer.Option(help="Sequence length (token models).")] = None,  # noqa: UP045
    token_dist: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="uniform or zipf token ids, or text (the model's text input)."),
    ] = None,
    length_dist: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="full, uniform (random padding) or real (lengths in [seq/8, seq]) lengths."),
    ] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the request pool.")] = None,  # noqa: UP045
    processes: Annotated[
        Optional[int], typer.Option(help="Locust worker processes (0: one plain process).")  # noqa: UP045
    ] = None,
    protocol: Annotated[Optional[str], typer.Option(help="http (binary tensors) or grpc.")] = None,  # noqa: UP045
    check: Annotated[bool, typer.Option(help="Compare every response with the PyTorch reference.")] = False,
    repeat: Annotated[int, typer.Option(help="Rounds, interleaved A,B,A,B...")] = 1,
    url: Annotated[
        Optional[str], typer.Option(help="HTTP host:port of a running server (default: start one).")  # noqa: UP045
    ] = None,
    grpc_url: Annotated[Optional[str], typer.Option(help="gRPC host:port (default: URL's host:8001).")] = None,  # noqa: UP045
    metrics_url: Annotated[
        Optional[str], typer.Option(help="Metrics URL (default: http://URL's host:8002/metrics).")  # noqa: UP045
    ] = None,
    repository: Annotated[Path, typer.Option(help="Model repository.")] = Path("model_repository"),
    out: Annotated[Path, typer.Option(help="Folder for ab-<timestamp>.json/.md/.png and the raw data.")] = Path(
        "results"
    ),
    locustfile: Annotated[Optional[Path], typer.Option(help="Locust file (default: loadtest/locustfile.py).")] = None,  # noqa: UP045
    tritonserver: Annotated[Optional[str], typer.Option(help="tritonserver binary when starting one.")] = None,  # noqa: UP045
    backend_config: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--backend-config",
            help="Extra --backend-config for the server it starts, e.g. python,shm-default-byte-size=67108864.",
        ),
    ] = None,
    server_arg: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(
            "--server-arg",
            help="Extra tritonserver argument for the server it starts (repeat the flag), e.g. "
            "--server-arg=--http-thread-count=16; recorded in the JSON.",
        ),
    ] = None,
    keep_raw: Annotated[bool, typer.Option(help="Keep the raw latency files and the request pools.")] = False,
    unload_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a variant may take to unload (Triton finalizes its instances one at a time); "
            "past it the runner waits --unload-grace more: a slow unload if it completes, "
            "else a stall (a caveat of its run)."
        ),
    ] = 120.0,
    unload_grace: Annotated[
        float, typer.Option(help="Seconds past --unload-timeout that tell a slow unload from a stalled one.")
    ] = 60.0,
    rate: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="Open loop: offered rates to sweep, requests/s, e.g. 1000,2000,4k (one window each); arrivals "
            "independent of the answers, latency from each request's scheduled send time."
        ),
    ] = None,
    search: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Open loop: LOW,HIGH req/s: find the capacity at the SLO by bisection (after any --rate)."),
    ] = None,
    slo: Annotated[float, typer.Option(help="Open loop: p99 latency SLO of the capacity, milliseconds.")] = 50.0,
    search_steps: Annotated[int, typer.Option(help="Open loop: most midpoints the search measures.")] = 6,
    rate_repeat: Annotated[
        int,
        typer.Option(
            help="Open loop: consecutive windows per --rate (a soak: --rate R --rate-repeat 5 --window 60 compares "
            "the first and last minute's p99 and the stubs' memory)."
        ),
    ] = 1,
    search_tolerance: Annotated[
        float, typer.Option(help="Open loop: stop the search when HIGH-LOW is within this fraction of LOW.")
    ] = 0.05,
    arrival: Annotated[Optional[str], typer.Option(help="Open loop: poisson (default) or constant.")] = None,  # noqa: UP045
    max_connections: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Open loop: keep-alive connections per Locust process (default 256)."),
    ] = None,
    check_every: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="Open loop: decode every Nth answer in full, check the rest's status and length (16)."),
    ] = None,
    generator: Annotated[
        str,
        typer.Option(
            help="Open loop: locust (its OpenLoopHttpUser) or asyncio (inflight.loadtest.rategen: the same "
            "schedule and accounting at a fraction of Locust's CPU per request, for rates Locust cannot hold)."
        ),
    ] = "locust",
    server_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Cores of the server it starts and its stubs (taskset -c form, e.g. 0-15)."),
    ] = None,
    client_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="Cores of Locust and this runner (e.g. 16-31)."),
    ] = None,
    isolate: Annotated[
        bool,
        typer.Option(
            help="Pin the server and the load generator to disjoint halves of the cores when the host has 8 or "
            "more (recorded in the JSON); --no-isolate shares them (with --server-cpus alone: the server pinned "
            "there, the generator on every core)."
        ),
    ] = True,
    server_per_gpu: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            "--server-per-gpu",
            help="Open loop with --generator asyncio: start one tritonserver per listed GPU (0,1 or 0/1), each "
            "seeing only its GPU (CUDA_VISIBLE_DEVICES) on its own contiguous share of the server cores, and "
            "spread the generator's sources over them (--processes >= the number of servers). Variants must not "
            "name gpus= other than gpus=0.",
        ),
    ] = None,
    balancer: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="With --server-per-gpu: nginx, a real load balancer in front of the servers' HTTP endpoints (round "
            "robin, keep-alive to every server; the binary from INFLIGHT_NGINX, PATH or .venv/nginx). Every variant's "
            "load goes to it unless its spec says via=direct (spread over the servers) or via=gpu<N>; list the same "
            "spec both ways (minilm_null minilm_null@via=direct) to see the balancer's own cost. Recorded: layout, "
            "nginx's version, configuration, cores and CPU per window.",
        ),
    ] = None,
    balancer_cpus: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="The balancer's own cores (taskset -c form), kept out of the server's and the generator's; "
            "default: it shares the server cores."
        ),
    ] = None,
    balancer_workers: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="nginx worker processes (default: one per --balancer-cpus core, else one per server)."),
    ] = None,
    verbose: bool = False,
) -> None:
    """Run the A/B load test: the same Locust load against each variant in turn, on one server.

    Closed loop by default (--users users, each sending its next request when the last returned). With
    --rate and/or --search, open loop: requests arrive at each offered rate (Poisson), and the report gives
    p50/p95/p99 per rate and the capacity at the p99 SLO (--slo) per variant, with a latency-vs-rate plot.
    """
    setup_logging(verbose)
    from inflight.loadtest import list_options, presets
    from inflight.loadtest.runner.ab import run_ab
    from inflight.loadtest.runner.config import AbConfig

    try:
        server_gpus = list_options.parse_gpus(server_per_gpu) if server_per_gpu is not None else []
        rates = list_options.parse_rates(rate) if rate else []
        bounds: tuple[float, float] | None = None
        if search:
            lohi = list_options.parse_rates(search)
            if len(lohi) != 2:
                raise InflightError(f"--search {search!r}: give LOW,HIGH requests per second, e.g. 2000,30000")
            bounds = (lohi[0], lohi[1])
        shape = presets.preset(preset).replace(
            window_s=window,
            warmup_s=warmup,
            users=users,
            spawn_rate=spawn_rate,
            items=items,
            seq_len=seq_len,
            token_dist=token_dist,
            length_dist=length_dist,
            seed=seed,
            processes=processes,
            protocol=protocol,
            check=check or None,
        )
        if users is not None and spawn_rate is None:
            shape = shape.replace(spawn_rate=float(min(users, 1000)))
        if rates or bounds:
            # open loop: one arrival source (Locust user) per process; the rate is set per window
            sources = users or max(1, shape.processes)
            shape = shape.replace(
                users=sources,
                spawn_rate=float(sources),
                arrival=arrival,
                max_connections=max_connections,
                check_every=check_every,
            )
        path = run_ab(
            AbConfig(
                variants=variants,
                shape=shape,
                repository=repository,
                out=out,
                url=url,
                grpc_url=grpc_url,
                metrics_url=metrics_url,
                repeat=repeat,
                locustfile=locustfile,
                tritonserver=tritonserver,
                backend_config=tuple(backend_config or ()),
                server_args=tuple(server_arg or ()),
                keep_raw=keep_raw,
                preset=preset,
                unload_timeout_s=unload_timeout,
                unload_grace_s=unload_grace,
                rates=rates,
                search=bounds,
                slo_ms=slo,
                search_steps=search_steps,
                rate_repeat=rate_repeat,
                search_tolerance=search_tolerance,
                server_cpus=server_cpus,
                client_cpus=client_cpus,
                isolate=isolate,
                generator=generator,  # type: ignore[arg-type]  # checked by AbConfig
                server_gpus=server_gpus,
                balancer=balancer,
                balancer_cpus=balancer_cpus,
                balancer_workers=balancer_workers,
            )
        )
    except InflightError as e:
        fail(e)
    _echo_summary(path)


def _echo_summary(path: Path) -> None:
    doc = json.loads(path.read_text())
    open_loop = not doc["load"].get("closed_loop", True)
    if open_loop:
        _echo_open_loop(doc)
    for s in [] if open_loop else doc["summary"]:
        lat = s.get("latency_ms") or {}

        def ms(key: str, lat: dict[str, float] = lat) -> str:
            v = lat.get(key)
            return f"{v:.2f}" if isinstance(v, (int, float)) else "n/a"

        rps = s.get("rps")
        typer.echo(
            f"{s['variant']} {s['spec']}: {rps if rps is None else round(rps, 1)} req/s, p50 {ms('p50')} ms, "
            f"p95 {ms('p95')} ms, p99 {ms('p99')} ms, {s['failures']} failures"
        )
    typer.echo(f"results: {path} and {path.with_suffix('.md')}")
    for c in doc.get("caveats", []):
        typer.secho(f"CAVEAT: {c}", fg=typer.colors.YELLOW, err=True)
    if not doc.get("valid"):
        for p in doc.get("problems", []):
            typer.secho(f"INVALID: {p}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    if any(s["failures"] for s in doc["summary"]):
        typer.secho("some requests failed; see the report", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(1)


def _ms(x: object) -> str:
    return f"{x:8.2f}" if isinstance(x, (int, float)) else "     n/a"


def _echo_open_loop(doc: dict[str, object]) -> None:
    ol = doc["load"]["open_loop"]  # type: ignore[index]
    typer.echo(f"open loop, p99 SLO {ol['slo_p99_ms']:g} ms; CPU sets {doc['load']['cpu_sets']}")  # type: ignore[index]
    server: dict[str, Any] = doc.get("server") or {}  # type: ignore[assignment]
    servers = server.get("per_gpu_servers")
    if servers:
        from inflight.loadtest.report import deployment_line

        answered = server.get("per_server_requests") or []
        typer.echo(
            f"servers: {deployment_line(servers)}"
            + (
                "; requests answered: "
                + ", ".join(f"GPU {s['gpu']} {n}" for s, n in zip(servers, answered, strict=False))
                if answered
                else ""
            )
        )
        front = server.get("balancer")
        if front:
            typer.echo(f"balancer: {front['version'] or front['kind']} on {front['cpus_rule']}")
    for s in doc["summary"]:  # type: ignore[attr-defined]
        for p in s.get("sweep", []):
            typer.echo(
                f"  {s['variant']} offered {p['offered_rps']:>9,.0f}  achieved {p['achieved_rps']:>9,.0f}  "
                f"p50 {_ms(p['p50_ms'])}  p95 {_ms(p['p95_ms'])}  p99 {_ms(p['p99_ms'])} ms  failures "
                f"{p['failures']}  avg batch {p.get('avg_batch_requests') or 0:.1f} req"
                + ("  GENERATOR-LIMITED" if p["generator_limited"] else "")
                + ("  SLO met" if not p["slo_misses"] else "")
            )
        soak = s.get("soak")
        if soak:
            typer.echo(
                f"{s['variant']} soak at {soak['rate']:,.0f} req/s, {soak['windows']} windows: "
                f"{soak['failures']} failures, p99 first {soak['p99_ms'][0]:.2f} ms -> last "
                f"{soak['p99_ms'][-1]:.2f} ms ({100 * soak['p99_change']:+.1f}%), "
                f"stub memory {soak['stub_rss_bytes'][0] / 2**20:.0f} -> {soak['stub_rss_bytes'][-1] / 2**20:.0f} MiB "
                f"({100 * soak['stub_rss_change']:+.1f}%): {'PASSED' if soak['passed'] else 'FAILED'}"
            )
        cap = s.get("capacity_rps")
        bound = "" if s.get("capacity_bounded") else " (a lower bound: every rate tried met the SLO)"
        typer.echo(
            f"{s['variant']} {s['spec']}: capacity at p99 <= {ol['slo_p99_ms']:g} ms: "
            + (f"{cap:,.0f} req/s{bound}" if cap is not None else "none of the rates tried")
            + ("" if s.get("comparable") else " [not comparable: the generator fell behind at or below it]")
        )


def ab_report_cmd(
    result: Annotated[Path, typer.Argument(help="A results/ab-<timestamp>.json written by `inflight ab`.")],
    verbose: bool = False,
) -> None:
    """Regenerate the Markdown report and plots of an A/B result from its JSON."""
    setup_logging(verbose)
    from inflight.loadtest.report import write_report

    try:
        md, images = write_report(result)
    except InflightError as e:
        fail(e)
    typer.echo(f"wrote {md}" + "".join(f", {p}" for p in images))


def register(app: typer.Typer) -> None:
    """Add ``ab`` and ``ab-report`` to ``app`` (the ``inflight`` command line)."""
    app.command("ab")(ab_cmd)
    app.command("ab-report")(ab_report_cmd)


def main() -> None:
    """Run these commands without the main CLI: ``python -m inflight.loadtest.cli ab ...``."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, help="inflight A/B load test.")
    register(app)
    app()


if __name__ == "__main__":
    main()
