"""What an A/B run is asked to do: :class:`AbConfig` (which checks itself), its variants and endpoints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from inflight.errors import ConfigError
from inflight.loadtest import openloop as ol
from inflight.loadtest.list_options import parse_rates
from inflight.loadtest.presets import LoadShape
from inflight.server import ensemble as ens
from inflight.variants import VariantConfig, parse_variant_arg

#: The logger of every part of the runner (the package's, as the log lines have always named it).
LOGGER_NAME = "inflight.loadtest.runner"

Generator = Literal["locust", "asyncio"]
GENERATORS: tuple[Generator, ...] = ("locust", "asyncio")
#: Load balancers the runner can put in front of the per-GPU servers (``--balancer``).
BALANCERS: tuple[str, ...] = ("nginx",)
#: Where a variant's load goes (its ``via=`` key): through the balancer, spread over every server directly, or
#: straight to one GPU's server (``gpu<N>``).
ROUTE_BALANCER = "balancer"
ROUTE_DIRECT = "direct"
ROUTE_GPU_PREFIX = "gpu"
#: Keys of a variant spec that the runner reads itself (where the load goes, its own rates); never sent to the server.
RUNNER_KEYS = ("via", "rates")


@dataclass(kw_only=True)
class AbConfig:
    """One A/B test; it checks itself when made (:meth:`__post_init__`).

    Attributes:
        variants: Variant specs, ``name[@key=value,...]``; the first is the baseline A.
        shape: The load, identical for every variant.
        repository: Model repository (configs to override, artifacts for ``--check``).
        out: Folder for the JSON, the report and the raw data.
        url: HTTP ``host:port`` of a running server; None starts one on free ports.
        grpc_url: gRPC ``host:port`` (default: the URL's host, port 8001).
        metrics_url: Metrics endpoint (default: ``http://<host>:8002/metrics``).
        repeat: Rounds; each round runs every variant once (A, B, A, B...).
        locustfile: The Locust file (default: ``loadtest/locustfile.py`` of the checkout).
        tritonserver: Server binary when the runner starts one.
        backend_config: Extra ``--backend-config`` entries for the server it starts.
        server_args: More tritonserver arguments for the server it starts (e.g. ``--http-thread-count=16``).
        keep_raw: Keep the raw latency files (they can be large) and the request pools next to the results.
        progress_interval_s: Seconds between progress lines and GPU gauge samples.
        preset: Name of the preset the shape came from (recorded only).
        unload_timeout_s: How long a variant may take to unload after its window. Triton
            finalizes a model's instances one after another (about 2 s each for bert_tiny on the
            H200), so a many-instance variant can take longer: the runner then waits
            ``unload_grace_s`` more and records a *slow* unload if it completes (not a problem), or
            a *stalled* one if it does not (a caveat of that run, with a dump of its stubs and
            Triton's request counters), and goes on with the next variant.
        unload_grace_s: The extra wait that tells a slow unload from a stalled one.
        rates: Open loop: offered rates (requests per second) to sweep, one window each; empty and
            no ``search``: closed loop.
        search: Open loop: ``(low, high)`` req/s of a capacity search by bisection after the sweep.
        slo_ms: p99 latency SLO of the capacity (milliseconds, from the scheduled send time).
        search_tolerance: The search stops when its interval is within this fraction of its low end.
        search_steps: Most midpoints the search measures.
        rate_repeat: Open loop: consecutive windows at each ``rates`` entry (a soak: one rate, several
            windows, the variant loaded throughout; the report compares the first and last).
        server_cpus: Cores of the server (``taskset -c`` form); None: chosen by ``split_cpus``.
        client_cpus: Cores of the load generator (and this runner); None: chosen likewise.
        isolate: Pin the server and the generator to disjoint cores when the host has enough.
        generator: Open loop: ``locust`` (Locust's ``OpenLoopHttpUser``) or ``asyncio``
            (:mod:`inflight.loadtest.rategen`, for rates Locust cannot hold on the generator's cores).
        server_gpus: GPU indices, one tritonserver per entry (open loop with the asyncio generator,
            no ``url``): each sees only its GPU (``CUDA_VISIBLE_DEVICES``, through the inherited one
            when set), as device 0, and runs on its own contiguous share of ``server_cpus``; the
            generator's sources are spread over the servers. Empty: one server for every GPU.
        balancer: ``nginx``: with ``server_gpus``, a load balancer in front of the servers' HTTP endpoints
            (:class:`~inflight.server.balancer.Balancer`, round robin, keep-alive to every server); the
            generator sends each variant's load to it unless the variant says ``via=direct`` or ``via=gpu<N>``.
        balancer_cpus: The balancer's own cores (``taskset -c`` form), kept out of the server's and the
            generator's; None: it runs on the server cores (the union of the per-GPU shares).
        balancer_workers: nginx worker processes; None: one per balancer core when it has its own, else one
            per server.
    """

    variants: Sequence[str]
    shape: LoadShape
    repository: Path
    out: Path = Path("results")
    url: str | None = None
    grpc_url: str | None = None
    metrics_url: str | None = None
    repeat: int = 1
    locustfile: Path | None = None
    tritonserver: str | None = None
    backend_config: Sequence[str] = ()
    server_args: Sequence[str] = ()
    keep_raw: bool = False
    progress_interval_s: float = 5.0
    preset: str | None = None
    unload_timeout_s: float = 120.0
    unload_grace_s: float = 60.0
    rates: Sequence[float] = ()
    search: tuple[float, float] | None = None
    slo_ms: float = ol.DEFAULT_SLO_MS
    search_tolerance: float = 0.05
    search_steps: int = 6
    rate_repeat: int = 1
    server_cpus: str | None = None
    client_cpus: str | None = None
    isolate: bool = True
    generator: Generator = "locust"
    server_gpus: Sequence[int] = ()
    balancer: str | None = None
    balancer_cpus: str | None = None
    balancer_workers: int | None = None

    def __post_init__(self) -> None:
        """Check what the configuration alone can tell (the variants and the host are checked by the runner).

        Raises:
            ConfigError: naming the option, what is wrong and how to fix it.
        """
        self.shape.check_values()
        if self.repeat < 1:
            raise ConfigError(f"--repeat {self.repeat}: run each variant at least once")
        if self.open_loop:
            if self.generator not in GENERATORS:
                raise ConfigError(f"--generator {self.generator!r}: choose one of {', '.join(GENERATORS)}")
            if self.shape.protocol != "http" and self.generator != "asyncio":
                raise ConfigError(
                    f"--protocol {self.shape.protocol}: Locust's open-loop user (--rate/--search) speaks HTTP only; "
                    "add --generator asyncio (it speaks both) or drop --protocol"
                )
            if self.rate_repeat < 1:
                raise ConfigError(f"--rate-repeat {self.rate_repeat}: measure each rate at least once")
            if self.slo_ms <= 0:
                raise ConfigError(f"--slo {self.slo_ms}: give a p99 latency SLO > 0 milliseconds")
            if self.search is not None:
                lo, hi = self.search
                if not 0 < lo < hi:
                    raise ConfigError(f"--search {lo:g},{hi:g}: give LOW,HIGH requests per second with 0 < LOW < HIGH")
        elif self.generator != "locust":
            raise ConfigError(
                f"--generator {self.generator}: the asyncio generator sends open-loop load only; add --rate or "
                "--search, or drop --generator"
            )
        if self.server_gpus:
            self._check_server_gpus()
        self._check_balancer()

    @property
    def open_loop(self) -> bool:
        """True when the load is open loop: offered rates to sweep, a capacity search, or both."""
        return bool(self.rates) or self.search is not None

    def _check_balancer(self) -> None:
        """What ``--balancer`` needs: one server per GPU behind it, HTTP, sensible cores and workers.

        Raises:
            ConfigError: saying what does not fit and how to fix it.
        """
        if self.balancer is None:
            for flag, value in (("--balancer-cpus", self.balancer_cpus), ("--balancer-workers", self.balancer_workers)):
                if value is not None:
                    raise ConfigError(f"{flag} {value} sets up the balancer, but there is none: add --balancer nginx")
            return
        flag = f"--balancer {self.balancer}"
        if self.balancer not in BALANCERS:
            raise ConfigError(f"{flag}: choose one of {', '.join(BALANCERS)}")
        if not self.server_gpus:
            raise ConfigError(
                f"{flag} balances the load over one tritonserver per GPU, which the runner starts: add "
                "--server-per-gpu 0,1,... (with --generator asyncio and --rate or --search)"
            )
        if self.shape.protocol != "http":
            raise ConfigError(
                f"{flag} proxies HTTP only (its configuration has no gRPC upstream); drop --protocol "
                f"{self.shape.protocol} or the balancer"
            )
        if self.balancer_workers is not None and self.balancer_workers < 1:
            raise ConfigError(f"--balancer-workers {self.balancer_workers}: give at least one nginx worker")
        if self.balancer_cpus is not None:
            ol.parse_cpus(self.balancer_cpus)  # its own message names the list

    def _check_server_gpus(self) -> None:
        """What ``--server-per-gpu`` needs of the rest of the configuration (the variants are checked by the fleet).

        Raises:
            ConfigError: saying what does not fit and how to fix it.
        """
        flag = f"--server-per-gpu {gpu_list(self.server_gpus)}"
        if not self.open_loop or self.generator != "asyncio":
            raise ConfigError(
                f"{flag} spreads open-loop load over one server per GPU, which only the asyncio generator can send "
                "(Locust's users send to one URL); add --rate or --search and --generator asyncio"
            )
        if self.url is not None:
            raise ConfigError(
                f"{flag} starts its own servers, one per GPU; drop --url (or drop {flag} to measure the server at "
                f"{self.url})"
            )
        if self.grpc_url or self.metrics_url:
            raise ConfigError(
                f"{flag}: --grpc-url and --metrics-url name one server's endpoints, but the runner starts and watches "
                "every server itself; drop them"
            )


@dataclass(kw_only=True)
class Variant:
    """A variant to test: its label (A, B...), spec string and resolved configuration.

    Attributes:
        label: A, B, ...
        spec: As given (``name@key=value,...``).
        config: The configuration the server loads.
        overrides: The spec's keys that change the configuration.
        via: Where its load goes (the spec's ``via=``): ``balancer``, ``direct`` (spread over every server), or
            ``gpu<N>`` (the server of GPU N alone); None: the run's default (:func:`route_of`).
        rates: Its own open-loop rates (the spec's ``rates=``, ``/``-separated); empty: the run's ``--rate``.
        ensemble: When the spec names an ensemble (``NAME_text``): its other steps and itself, loaded after
            ``config`` (then the ensemble's encoder step) and sent the load; None: ``config`` is sent the load.
    """

    label: str
    spec: str
    config: VariantConfig
    overrides: dict[str, str] = field(default_factory=dict)
    via: str | None = None
    rates: tuple[float, ...] = ()
    ensemble: ens.Ensemble | None = None

    @property
    def name(self) -> str:
        """The name the load is sent to: the ensemble's, else the one the server serves ``config`` under."""
        return self.ensemble.name if self.ensemble is not None else self.config.model_name


@dataclass(kw_only=True)
class Endpoints:
    """Where the server listens."""

    http: str
    grpc: str
    metrics: str


def url_endpoints(url: str) -> Endpoints:
    """The endpoints of the server at ``url`` (``host:port``, HTTP): gRPC on 8001 and metrics on 8002 of its host."""
    host = url.split("://", 1)[-1].rstrip("/")
    hostname = host.rsplit(":", 1)[0] if ":" in host else host
    return Endpoints(http=host, grpc=f"{hostname}:8001", metrics=f"http://{hostname}:8002/metrics")


T = TypeVar("T")


def round_order(variants: Sequence[T], repeat: int) -> list[tuple[int, T]]:
    """The (round, variant) runs of ``repeat`` rounds: the given order, reversed every other round (A B, B A, ...).

    Alternating balances what running first or second costs a variant (a server that just left an
    overload window, caches warmed by the one before): with an even number of rounds each variant
    runs first as often as last.
    """
    return [(r, v) for r in range(repeat) for v in (variants if r % 2 == 0 else list(reversed(variants)))]


def load_groups(order: Sequence[tuple[int, Variant]], config: AbConfig) -> list[list[tuple[int, Variant]]]:
    """The runs of ``order`` (:func:`round_order`) cut into groups that share one load of the model.

    Consecutive runs of one round share a load when their model and configuration are the same and
    they differ in where their load goes (``via=``): the same deployment measured through the balancer
    and directly, say. Any other run gets a load of its own, as it always has.
    """
    groups: list[list[tuple[int, Variant]]] = []
    for r, v in order:
        last = groups[-1] if groups else None
        if (
            last is not None
            and last[0][0] == r
            and last[0][1].name == v.name
            and last[0][1].config.to_json() == v.config.to_json()
            and last[0][1].ensemble == v.ensemble
            and route_of(v, config) not in {route_of(w, config) for _, w in last}
        ):
            last.append((r, v))
        else:
            groups.append([(r, v)])
    return groups


def resolve_variants(specs: Sequence[str], repository: Path) -> list[Variant]:
    """Parse ``name@key=value,...`` specs and read/override each config from the repository.

    Raises:
        ConfigError: for no variants, a bad spec, or an unknown model.
        ServerError: when a config.pbtxt is missing (build the repository first).
    """
    if not specs:
        raise ConfigError("name at least one variant, e.g. `inflight ab bert_tiny_sync bert_tiny_inflight`")
    out = []
    for i, spec in enumerate(specs):
        name, overrides = parse_variant_arg(spec)
        via = overrides.pop("via", None)
        rates = overrides.pop("rates", None)
        vc, pipeline = ens.resolve_spec(repository, name, overrides)
        label = chr(ord("A") + i) if i < 26 else f"V{i + 1}"
        own = tuple(parse_rates(rates.replace("/", ","))) if rates is not None else ()
        out.append(
            Variant(label=label, spec=spec, config=vc, overrides=overrides, via=via, rates=own, ensemble=pipeline)
        )
    return out


def route_of(v: Variant, config: AbConfig) -> str:
    """Where ``v``'s load goes: its ``via=``, else through the balancer when there is one, else ``direct``."""
    if v.via is not None:
        return v.via
    return ROUTE_BALANCER if config.balancer else ROUTE_DIRECT


def check_routes(variants: Sequence[Variant], config: AbConfig) -> None:
    """Each variant's ``via=`` and ``rates=`` against the run: a balancer to go through, a server of that GPU.

    Raises:
        ConfigError: naming the variant, what is wrong and how to fix it.
    """
    gpus = [f"{ROUTE_GPU_PREFIX}{g}" for g in config.server_gpus]
    for v in variants:
        if v.rates and not config.open_loop:
            raise ConfigError(
                f"{v.spec}: rates= sets the variant's own open-loop rates, but this run is closed loop; add --rate "
                "or --search (the other variants' rates), or drop rates="
            )
        if v.via is None:
            continue
        if not config.server_gpus:
            raise ConfigError(
                f"{v.spec}: via= chooses among the servers of --server-per-gpu (and its --balancer); add "
                "--server-per-gpu 0,1,... or drop via="
            )
        if v.via == ROUTE_BALANCER and not config.balancer:
            raise ConfigError(f"{v.spec}: via=balancer, but this run has none; add --balancer nginx")
        if v.via not in (ROUTE_BALANCER, ROUTE_DIRECT, *gpus):
            raise ConfigError(
                f"{v.spec}: via={v.via!r}: choose {ROUTE_BALANCER}, {ROUTE_DIRECT} (spread over every server) or "
                f"the server of one GPU ({', '.join(gpus)})"
            )


def gpu_list(gpus: Sequence[int]) -> str:
    """GPU indices as ``--server-per-gpu`` takes them (``0,1``)."""
    return ",".join(map(str, gpus))
