"""``inflight ab --server-per-gpu ... --balancer nginx``: the parts that need no server.

The options' checks and what they say, the balancer's cores and workers by rule, where each
variant's load goes (``via=``), which runs share one load, and the balancer stopped whatever
happens while it quits. The end-to-end run is in ``tests/integration/test_ab_balancer.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from inflight.errors import ConfigError
from inflight.loadtest import cpu, presets
from inflight.loadtest import openloop as ol
from inflight.loadtest.runner.ab import AbRunner
from inflight.loadtest.runner.config import AbConfig, Endpoints, load_groups, round_order
from inflight.loadtest.runner.front import Front, FrontPlan
from inflight.loadtest.runner.plan import cpu_sets_for

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **changes: Any) -> AbConfig:
    base: dict[str, Any] = {
        "variants": ["bert_tiny_null@instances=2"],
        "shape": presets.smoke().replace(users=2, processes=2),
        "repository": ROOT / "model_repository",
        "out": tmp_path,
        "rates": [1000.0],
        "generator": "asyncio",
        "isolate": False,
        "server_gpus": [0, 1],
        "balancer": "nginx",
    }
    base.update(changes)
    return AbConfig(**base)


# -- the options' checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"server_gpus": ()},
            r"--balancer nginx balances the load over one tritonserver per GPU.*add --server-per-gpu",
        ),
        ({"balancer": "haproxy"}, r"--balancer haproxy: choose one of nginx"),
        ({"shape": presets.smoke().replace(users=2, protocol="grpc")}, r"proxies HTTP only.*drop --protocol grpc"),
        ({"balancer_workers": 0}, r"--balancer-workers 0: give at least one nginx worker"),
        ({"balancer": None, "balancer_cpus": "4-7"}, r"--balancer-cpus 4-7 sets up the balancer.*add --balancer nginx"),
        ({"balancer": None, "balancer_workers": 2}, r"--balancer-workers 2 sets up the balancer.*add --balancer nginx"),
        ({"balancer_cpus": "x"}, r"CPU list 'x'"),
    ],
)
def test_the_configuration_refuses_a_balancer_it_cannot_run(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _config(tmp_path, **changes)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"variants": ["bert_tiny_null@via=gpu2"]}, r"via='gpu2': choose balancer, direct .* \(gpu0, gpu1\)"),
        ({"variants": ["bert_tiny_null@via=nginx"]}, r"via='nginx': choose"),
        (
            {"variants": ["bert_tiny_null@via=balancer"], "balancer": None},
            r"via=balancer, but this run has none; add --balancer nginx",
        ),
        (
            {"variants": ["bert_tiny_null@via=direct"], "balancer": None, "server_gpus": ()},
            r"via= chooses among the servers of --server-per-gpu.*add --server-per-gpu",
        ),
        (
            {
                "variants": ["bert_tiny_null@rates=10/20"],
                "rates": (),
                "generator": "locust",
                "server_gpus": (),
                "balancer": None,
            },
            r"rates= sets the variant's own open-loop rates, but this run is closed loop",
        ),
        ({"variants": ["bert_tiny_null@rates=10/x"]}, r"'x' is not a number"),
    ],
)
def test_the_runner_refuses_a_route_the_run_does_not_have(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        AbRunner(_config(tmp_path, **changes))


def test_the_cli_says_how_to_fix_a_balancer_without_servers_per_gpu(tmp_path: Path) -> None:
    import typer

    from inflight.loadtest.cli import ab_cmd

    app = typer.Typer()
    app.command()(ab_cmd)
    args = ["bert_tiny_null", "--repository", str(ROOT / "model_repository"), "--out", str(tmp_path)]
    res = CliRunner().invoke(app, [*args, "--balancer", "nginx", "--rate", "10", "--generator", "asyncio"])
    assert res.exit_code == 2 and "add --server-per-gpu 0,1,..." in res.output
    assert "--balancer" in CliRunner().invoke(app, ["--help"]).output


# -- the balancer's cores and workers -------------------------------------------------------------


def test_the_balancer_shares_the_server_cores_by_default_with_a_worker_per_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu, "run_cores", lambda: list(range(16)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = AbRunner(_config(tmp_path, isolate=True, server_cpus="0-7", client_cpus="8-15"))
    assert r.fleet.front is not None
    plan = r.fleet.front.plan
    assert (ol.format_cpus(plan.cpus), plan.own_cores, plan.workers) == ("0-7", False, 2)
    assert plan.rule.startswith("the server cores 0-7 (no --balancer-cpus") and "one per server" in plan.rule
    assert r.fleet.layout == "per-gpu-servers+nginx"
    # workers given: kept, and said so
    r = AbRunner(_config(tmp_path, isolate=True, server_cpus="0-7", client_cpus="8-15", balancer_workers=3))
    assert r.fleet.front is not None and r.fleet.front.plan.workers == 3
    assert "(--balancer-workers)" in r.fleet.front.plan.rule


def test_the_balancers_own_cores_are_kept_out_of_the_server_and_generator_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu, "run_cores", lambda: list(range(16)))
    config = _config(tmp_path, isolate=True, balancer_cpus="12-15")
    sets = cpu_sets_for(config)
    # the other 12 cores split in halves as without a balancer
    assert (ol.format_cpus(sets.server), ol.format_cpus(sets.client)) == ("0-5", "6-11")
    r = AbRunner(config)
    assert r.fleet.front is not None
    plan = r.fleet.front.plan
    assert (ol.format_cpus(plan.cpus), plan.own_cores, plan.workers) == ("12-15", True, 4)
    assert plan.rule == "its own cores 12-15 (--balancer-cpus), 4 workers"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (
            {"balancer_cpus": "6-9", "server_cpus": "0-7"},
            r"--balancer-cpus 6-9 overlaps --server-cpus 0-7 \(cores 6-7\)",
        ),
        (
            {"balancer_cpus": "8", "client_cpus": "8-15"},
            r"overlaps --client-cpus 8-15 \(cores 8\).*drop --balancer-cpus",
        ),
        ({"balancer_cpus": "14-17"}, r"--balancer-cpus 14-17: not all of these cores are available"),
    ],
)
def test_balancer_cores_the_run_cannot_give_it_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], fragment: str
) -> None:
    monkeypatch.setattr(cpu, "run_cores", lambda: list(range(16)))
    with pytest.raises(ConfigError, match=fragment):
        cpu_sets_for(_config(tmp_path, isolate=True, **changes))


# -- where the load goes --------------------------------------------------------------------------


def test_each_variant_goes_where_its_route_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = AbRunner(
        _config(
            tmp_path,
            variants=["bert_tiny_null", "bert_tiny_null@via=direct", "bert_tiny_null@via=gpu1,rates=5/10"],
        )
    )
    assert r.fleet.front is not None
    r.fleet.front.url = "127.0.0.1:9999"
    servers = [Endpoints(http=f"127.0.0.1:{p}", grpc=f"127.0.0.1:{p + 1}", metrics="m") for p in (8000, 8010)]
    through, direct, one = r.variants
    assert [e.http for e in r.fleet.targets(through, servers)] == ["127.0.0.1:9999"]
    assert r.fleet.targets(direct, servers) == servers
    assert r.fleet.targets(one, servers) == [servers[1]]
    assert (through.rates, one.rates) == ((), (5.0, 10.0))
    # the runner's keys are not configuration: the server loads the same model for all three
    assert through.config.to_json() == direct.config.to_json() == one.config.to_json()
    assert one.overrides == {}


def test_sources_need_not_match_the_servers_when_every_load_goes_through_the_balancer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    odd = presets.smoke().replace(users=3, processes=3)
    assert len(AbRunner(_config(tmp_path, shape=odd)).fleet.plans) == 2
    with pytest.raises(ConfigError, match=r"2 servers but 3 generator sources"):
        AbRunner(_config(tmp_path, shape=odd, variants=["bert_tiny_null", "bert_tiny_null@via=direct"]))


def test_a_round_shares_one_load_among_variants_that_differ_only_in_route(tmp_path: Path) -> None:
    r = AbRunner(
        _config(
            tmp_path,
            variants=[
                "bert_tiny_null",
                "bert_tiny_null@via=direct",
                "bert_tiny_null@instances=1",
                "bert_tiny_null@instances=1,via=direct",
                "bert_tiny_null@instances=1,via=direct,rates=5",
            ],
        )
    )
    groups = load_groups(round_order(r.variants, 2), r.config)
    labels = [[f"{v.label}{rnd + 1}" for rnd, v in g] for g in groups]
    # C and D share; E goes the same way as D, so it loads on its own
    assert labels == [["A1", "B1"], ["C1", "D1"], ["E1"], ["E2"], ["D2", "C2"], ["B2", "A2"]]
    # without routes nothing is shared, as before
    plain = AbRunner(_config(tmp_path, variants=["bert_tiny_null", "bert_tiny_null"], balancer=None))
    assert [len(g) for g in load_groups(round_order(plain.variants, 1), plain.config)] == [1, 1]


# -- stopping ------------------------------------------------------------------------------------


class _InterruptedBalancer:
    """A Balancer whose graceful stop is interrupted (Ctrl+C while nginx quits); ``proc`` is a real process."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def stop(self) -> None:
        raise KeyboardInterrupt


def test_an_interrupt_while_the_balancer_quits_kills_it_and_goes_on(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    front = Front(FrontPlan(kind="nginx", cpus=(), own_cores=False, workers=1, rule="test"), tmp_path)
    front.balancer = _InterruptedBalancer(proc)
    try:
        with pytest.raises(KeyboardInterrupt):
            front.stop()
        assert proc.poll() is not None, "the balancer's process outlived an interrupted stop"
        assert front.exit is not None and "KeyboardInterrupt" in front.exit["reason"]
        front.stop()  # safe twice
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
