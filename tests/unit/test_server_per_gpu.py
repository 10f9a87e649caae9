"""``inflight ab --server-per-gpu``: the parts that need no server.

The core split, the generator's server assignment, the checks of the configuration, Triton's
statistics and the executor counters summed over servers, the CPU accounting of several server
trees, and the report's deployment lines. The end-to-end run is in
``tests/integration/test_ab_per_gpu_servers.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from inflight.errors import ConfigError
from inflight.loadtest import cpu, list_options, presets, rategen_options, report, schedule
from inflight.loadtest import openloop as ol
from inflight.loadtest import rategen as rg
from inflight.loadtest import stats as st
from inflight.loadtest.runner.ab import AbRunner
from inflight.loadtest.runner.config import AbConfig, Endpoints
from inflight.loadtest.runner.gpu_servers import plan_gpu_servers
from inflight.loadtest.runner.metrics import per_server_requests, sum_counts
from inflight.loadtest.runner.plan import rategen_command

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures"

# -- the core split ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "parts", "shares"),
    [
        (range(20), 2, ["0-9", "10-19"]),
        (range(5), 2, ["0-2", "3-4"]),
        (range(16, 32), 3, ["16-21", "22-26", "27-31"]),
        ([0, 2, 4, 6, 8], 2, ["0,2,4", "6,8"]),  # contiguous in the set's order
        ([3, 1, 2, 0], 4, ["0", "1", "2", "3"]),
        (range(8), 1, ["0-7"]),
    ],
)
def test_share_cpus_cuts_the_server_cores_into_contiguous_shares(cpus: Any, parts: int, shares: list[str]) -> None:
    assert [ol.format_cpus(s) for s in ol.share_cpus(list(cpus), parts)] == shares


@pytest.mark.parametrize("n", range(1, 25))
def test_share_cpus_is_a_partition_into_nearly_equal_parts(n: int) -> None:
    cpus = list(range(4, 4 + n))
    for parts in range(1, n + 1):
        shares = ol.share_cpus(cpus, parts)
        assert len(shares) == parts
        assert [c for s in shares for c in s] == cpus  # disjoint, in order, nothing left out
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_share_cpus_of_no_cores_leaves_every_server_unpinned_and_refuses_too_many_servers() -> None:
    assert ol.share_cpus((), 3) == [(), (), ()]
    with pytest.raises(ConfigError, match=r"3 servers but only 2 server cores \(0-1\).*widen --server-cpus"):
        ol.share_cpus([0, 1], 3)
    with pytest.raises(ConfigError, match="at least one"):
        ol.share_cpus([0, 1], 0)


def test_parse_gpus_takes_commas_or_slashes_in_order() -> None:
    assert list_options.parse_gpus("0,1") == [0, 1]
    assert list_options.parse_gpus("0/1") == [0, 1]
    assert list_options.parse_gpus(" 1, 0 ") == [1, 0]
    assert list_options.parse_gpus("0,0") == [0, 0]  # duplicates are the runner's to refuse, with its message
    for bad in ("a", "0,-1", "", ","):
        with pytest.raises(ConfigError, match="GPU"):
            list_options.parse_gpus(bad)


def test_no_isolate_with_server_cpus_pins_the_server_alone() -> None:
    sets = ol.split_cpus(range(2), "0-1", None, isolate=False)
    assert sets.server == (0, 1) and sets.client == () and not sets.isolated
    assert "not pinned (--no-isolate)" in sets.reason
    with pytest.raises(ConfigError, match="not all of these cores"):
        ol.split_cpus(range(2), "0-3", None, isolate=False)
    # isolating (the default) keeps its meaning: the rest goes to the generator
    assert ol.split_cpus(range(16), "0-7").client == tuple(range(8, 16))


# -- the generator's servers ---------------------------------------------------------------------


def test_sources_are_spread_over_the_servers_round_robin() -> None:
    urls = ["127.0.0.1:8000", "127.0.0.1:9000"]
    assert [rategen_options.source_url(urls, i) for i in range(5)] == [urls[0], urls[1], urls[0], urls[1], urls[0]]
    three = ["h:1", "h:2", "h:3"]
    assert Counter(rategen_options.source_url(three, i) for i in range(11)) == {"h:1": 4, "h:2": 4, "h:3": 3}
    assert rategen_options.source_url(["h:1"], 7) == "h:1"
    with pytest.raises(ConfigError, match="--url"):
        rategen_options.source_url([], 0)


def test_options_target_each_sources_server(tmp_path: Path) -> None:
    pool = tmp_path / "pool.npz"
    pool.write_bytes(b"x")
    opts = rategen_options.GenOptions(
        host="ignored", port=1, model="m", pool_file=pool, rate=100.0, duration_s=1.0, processes=4, urls=("a:1", "b:2")
    )
    assert [opts.target(i) for i in range(4)] == [("a", 1), ("b", 2), ("a", 1), ("b", 2)]
    assert opts.servers() == ["a:1", "b:2"]
    opts.check_values()
    single = rategen_options.GenOptions(host="h", port=5, model="m", pool_file=pool, rate=1.0, duration_s=1.0)
    assert single.servers() == ["h:5"] and single.target(3) == ("h", 5)
    # the rate is the total of all sources whatever the servers: each source's schedule carries rate / processes
    assert schedule.Schedule(100.0, index=3, sources=4).source_rate == 25.0


def test_options_need_a_source_per_server(tmp_path: Path) -> None:
    pool = tmp_path / "pool.npz"
    pool.write_bytes(b"x")
    opts = rategen_options.GenOptions(
        host="h", port=1, model="m", pool_file=pool, rate=10.0, duration_s=1.0, processes=1, urls=("a:1", "b:2")
    )
    with pytest.raises(ConfigError, match=r"--processes 1 with 2 servers.*--processes 2 or more"):
        opts.check_values()
    # 3 sources over 2 servers would give one server twice the other's rate
    with pytest.raises(ConfigError, match=r"--processes 3 with 2 servers.*unequal shares; pass a multiple of 2"):
        rategen_options.GenOptions(
            host="h", port=1, model="m", pool_file=pool, rate=10.0, duration_s=1.0, processes=3, urls=("a:1", "b:2")
        ).check_values()


def test_url_lists_are_parsed_and_checked() -> None:
    assert rategen_options.parse_urls("127.0.0.1:8000,127.0.0.1:9000") == ["127.0.0.1:8000", "127.0.0.1:9000"]
    assert rategen_options.parse_urls("http://h:1/, h:2") == ["h:1", "h:2"]
    assert rategen_options.parse_url(":80") == ("127.0.0.1", 80)
    with pytest.raises(ConfigError, match="host:port"):
        rategen_options.parse_urls("h:1,h")
    with pytest.raises(ConfigError, match="more than once"):
        rategen_options.parse_urls("h:1,h:1")
    with pytest.raises(ConfigError, match="names no server"):
        rategen_options.parse_urls(" , ")


def test_summary_records_the_servers_and_what_each_got() -> None:
    a = ol.Lateness(scheduled=100, completed=98, ok=97, span_s=2.0, stopped=True)
    b = ol.Lateness(scheduled=50, completed=50, ok=50, span_s=2.0, stopped=True)
    c = ol.Lateness(scheduled=60, completed=60, ok=60, span_s=2.0, stopped=True)
    reports = [
        {"index": i, "url": u, "counts": x.to_dict(), "failures": {}, "cpu_s": 0.1, "busy": 0.1, "peak_connections": 1}
        for i, (u, x) in enumerate((("a:1", a), ("b:2", b), ("a:1", c)))
    ]
    opts = rategen_options.GenOptions(
        host="a", port=1, model="m", pool_file=Path("p"), rate=100.0, duration_s=2.0, processes=3, urls=("a:1", "b:2")
    )
    s = rg.summarize(reports, opts)
    assert s["urls"] == ["a:1", "b:2"] and s["options"]["urls"] == ("a:1", "b:2")
    assert s["per_url"] == {
        "a:1": {"sources": 2, "requests": 158, "ok": 157},
        "b:2": {"sources": 1, "requests": 50, "ok": 50},
    }
    assert s["requests"] == 208


def test_rategen_command_lists_every_servers_url(tmp_path: Path) -> None:
    eps = [Endpoints(http=f"127.0.0.1:{p}", grpc="g", metrics="m") for p in (8000, 9000)]
    shape = presets.smoke().replace(users=4, rate=1000.0)
    cmd = rategen_command(
        shape=shape, model="bert_tiny_null", endpoints=eps, duration_s=3, pool_file=tmp_path / "p", raw_dir=tmp_path
    )
    assert cmd[cmd.index("--url") + 1] == "127.0.0.1:8000,127.0.0.1:9000"
    assert cmd[cmd.index("--rate") + 1] == "1000" and cmd[cmd.index("--processes") + 1] == "4"
    one = rategen_command(
        shape=shape, model="m", endpoints=eps[0], duration_s=3, pool_file=tmp_path / "p", raw_dir=tmp_path
    )
    assert one[one.index("--url") + 1] == "127.0.0.1:8000"


# -- the configuration's checks ------------------------------------------------------------------


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
    }
    base.update(changes)
    return AbConfig(**base)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"rates": (), "generator": "locust"}, r"add --rate or --search and --generator asyncio"),
        ({"generator": "locust"}, r"only the asyncio generator can send"),
        ({"url": "127.0.0.1:8000"}, r"starts its own servers, one per GPU; drop --url"),
        ({"metrics_url": "http://h:1/metrics"}, r"--grpc-url and --metrics-url name one server's endpoints"),
        ({"variants": ["bert_tiny_sync@gpus=0/1"]}, r"bert_tiny_sync@gpus=0/1 places its instances with gpus=.*drop"),
        ({"variants": ["bert_tiny_null", "bert_tiny_sync@gpus=1"]}, r"bert_tiny_sync@gpus=1 places"),
        ({"server_gpus": [0, 0]}, r"GPU 0 listed more than once"),
        ({"server_gpus": [1, -1]}, r"-1 is not a GPU index"),
        (
            {"shape": presets.smoke().replace(users=1)},
            r"2 servers but 1 generator source;.*--processes a multiple of 2",
        ),
        (
            {"shape": presets.smoke().replace(users=3)},
            r"2 servers but 3 generator sources;.*--processes a multiple of 2",
        ),
        ({"server_cpus": "0"}, r"--server-per-gpu 0,1: 2 servers but only 1 server core \(0\)"),
    ],
)
def test_the_runner_refuses_what_per_gpu_servers_cannot_run(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        AbRunner(_config(tmp_path, **changes))


def test_a_per_gpu_deployment_is_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    r = AbRunner(_config(tmp_path, variants=["bert_tiny_null@gpus=0", "bert_tiny_sync@instances=8"]))
    # not pinned (--no-isolate): every server on every core, each shown its own GPU
    assert [(p.gpu, p.visible_device, p.cpus) for p in r.fleet.plans] == [(0, "0", ()), (1, "1", ())]
    assert [p.log_name for p in r.fleet.plans] == ["tritonserver-gpu0.log", "tritonserver-gpu1.log"]
    # without the flag nothing changes
    assert AbRunner(_config(tmp_path, server_gpus=())).fleet.plans == []


class _FakeServer:
    """Stands in for a TritonServer at stop time: ``stop()`` returns 0 or raises ``error``."""

    def __init__(self, log: Path, error: BaseException | None = None) -> None:
        self.log_path = log
        self.error = error
        self.stopped = False
        self.exit_reason: str | None = None
        self.process = None
        log.write_text("==== tritonserver started by inflight\n")

    def stop(self) -> int:
        self.stopped = True
        if self.error is not None:
            raise self.error
        return 0


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_every_server_is_stopped_when_stopping_one_fails(tmp_path: Path, error: BaseException) -> None:
    r = AbRunner(_config(tmp_path))
    r.fleet.data = tmp_path / "data"
    r.fleet.data.mkdir()
    servers = [_FakeServer(tmp_path / "a.log", error), _FakeServer(tmp_path / "b.log")]
    r.fleet.servers = list(servers)
    if isinstance(error, Exception):
        exits = r.fleet.stop()
        assert exits[0]["reason"] == "stopping it failed: RuntimeError: boom" and exits[1]["code"] == 0
        doc: dict[str, Any] = {"server": {"per_gpu_servers": [{"gpu": 0}, {"gpu": 1}]}, "caveats": []}
        r.fleet.attach_exits(doc, exits)
        assert doc["server"]["exit"] == {"code": None, "reason": "GPU 0: stopping it failed: RuntimeError: boom"}
        assert doc["server"]["per_gpu_servers"][1]["exit"] == {"code": 0, "reason": None}
        assert doc["caveats"] == [
            "tritonserver for GPU 0 exited non-gracefully (code None): stopping it failed: RuntimeError: boom"
        ]
    else:  # an interrupt while stopping the first: the second is stopped, then the interrupt goes on
        with pytest.raises(KeyboardInterrupt):
            r.fleet.stop()
    assert all(s.stopped for s in servers)
    assert sorted(p.name for p in r.fleet.data.iterdir()) == ["tritonserver-gpu0.log", "tritonserver-gpu1.log"]


def test_plans_split_the_server_cores_and_follow_the_inherited_visible_devices() -> None:
    plans = plan_gpu_servers([0, 1], list(range(20)), None)
    assert [(p.gpu, p.visible_device, ol.format_cpus(p.cpus)) for p in plans] == [(0, "0", "0-9"), (1, "1", "10-19")]
    # a lane that sees GPUs 2 and 3: index 1 is physical GPU 3
    assert [p.visible_device for p in plan_gpu_servers([1], [0], "2,3")] == ["3"]
    with pytest.raises(ConfigError, match=r"CUDA_VISIBLE_DEVICES='2' shows 1 GPU \(indices 0..0\)"):
        plan_gpu_servers([0, 1], [0, 1], "2")
    with pytest.raises(ConfigError, match="names no GPU"):
        plan_gpu_servers([], [0], None)


def test_the_cli_parses_the_flag_and_reports_a_bad_one(tmp_path: Path) -> None:
    import typer

    from inflight.loadtest.cli import ab_cmd

    app = typer.Typer()
    app.command()(ab_cmd)
    args = ["bert_tiny_null", "--repository", str(ROOT / "model_repository"), "--out", str(tmp_path)]
    bad = CliRunner().invoke(app, [*args, "--server-per-gpu", "0,x", "--rate", "10", "--generator", "asyncio"])
    assert bad.exit_code == 2 and "'x' is not a GPU index" in bad.output
    # parsed (0/1 form), then refused by the runner with its message: Locust cannot send to two servers
    locust = CliRunner().invoke(app, [*args, "--server-per-gpu", "0/1", "--rate", "10", "--processes", "2"])
    assert locust.exit_code == 2 and "--server-per-gpu 0,1 spreads open-loop load" in locust.output


# -- figures summed over the servers -------------------------------------------------------------


def _snapshots(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    d = json.loads((FIXTURES / f"model-stats-{model}.json").read_text())
    return d["before"], d["after"]


def _renamed(entry: dict[str, Any], name: str) -> dict[str, Any]:
    return {**json.loads(json.dumps(entry)), "name": name}


def test_inference_stats_summed_over_servers_give_the_sum_of_their_windows() -> None:
    b0, a0 = _snapshots("bert_tiny_sync")
    b1, a1 = (_renamed(x, "bert_tiny_sync") for x in _snapshots("bert_tiny_inflight"))
    before, after = st.sum_model_stats([b0, b1]), st.sum_model_stats([a0, a1])
    d0, d1 = st.stats_delta(b0, a0), st.stats_delta(b1, a1)
    both = st.stats_delta(before, after)
    assert both.requests == d0.requests + d1.requests > 0
    assert both.inferences == d0.inferences + d1.inferences and both.executions == d0.executions + d1.executions
    # times per request: the servers' means weighted by their requests (the counters' ns add up)
    for attr in ("request_us", "queue_us", "compute_input_us", "compute_infer_us", "compute_output_us"):
        expect = (getattr(d0, attr) * d0.requests + getattr(d1, attr) * d1.requests) / both.requests
        assert getattr(both, attr) == pytest.approx(expect), attr
    assert both.avg_batch_items == pytest.approx(both.inferences / both.executions)
    # field by field: counts and ns add, batch sizes are matched, the latest inference wins, strings stay
    assert (
        after["inference_stats"]["queue"]["ns"]
        == a0["inference_stats"]["queue"]["ns"] + a1["inference_stats"]["queue"]["ns"]
    )
    assert after["last_inference"] == max(a0["last_inference"], a1["last_inference"])
    assert after["name"] == "bert_tiny_sync" and after["version"] == a0["version"]
    sizes = {e["batch_size"]: e for e in after["batch_stats"]}
    assert sorted(sizes) == sorted({e["batch_size"] for e in a0["batch_stats"] + a1["batch_stats"]})
    for size, entry in sizes.items():
        parts = [e for e in a0["batch_stats"] + a1["batch_stats"] if e["batch_size"] == size]
        assert entry["compute_infer"]["count"] == sum(e["compute_infer"]["count"] for e in parts)
        assert entry["compute_infer"]["ns"] == sum(e["compute_infer"]["ns"] for e in parts)


def test_summing_stats_of_different_models_or_none_is_refused() -> None:
    b0, _ = _snapshots("bert_tiny_sync")
    b1, _ = _snapshots("bert_tiny_inflight")
    with pytest.raises(st.StatsError, match="different models"):
        st.sum_model_stats([b0, b1])
    with pytest.raises(st.StatsError, match="no statistics"):
        st.sum_model_stats([])
    assert st.sum_model_stats([b0]) == b0


def test_per_server_requests_and_request_counters() -> None:
    b0, a0 = _snapshots("bert_tiny_sync")
    assert per_server_requests([b0, b0], [a0, b0]) == [st.stats_delta(b0, a0).requests, 0]
    assert per_server_requests([a0], [b0]) == [None]  # went backwards: not a window
    counts = sum_counts(
        [
            {"pending": 0, "success": 10, "failure": None, "executions": 3, "lines": ["x"]},
            {"pending": 2, "success": 5, "failure": None, "executions": 1, "lines": ["y"]},
        ]
    )
    assert counts == {"pending": 2, "success": 15, "failure": None, "executions": 4}


def _finalize_line(model: str, instance: str, batches: int) -> str:
    stats = json.dumps({"batches": batches, "requests": 2 * batches, "executes": batches, "execute_s": 0.001 * batches})
    escaped = stats.replace('"', '\\"')
    head = 'I1121 12:50:57.990159 507 log.py:31] "[inflight.runtime.triton_model]'
    return f'{head} {model} ({instance}) finalized (drained): {escaped}"'


def test_executor_counters_of_several_servers_logs_go_to_the_right_runs() -> None:
    """Each server logs its instances' records of every run; a run takes its instances' records from each log.

    The instance names are the same on both servers (bert_tiny_sync_0_0), and joining the two logs into
    one text would give run 1 both of server 0's records and run 2 both of server 1's.
    """
    gpu0 = "\n".join([_finalize_line("bert_tiny_sync", "bert_tiny_sync_0_0", n) for n in (100, 300)])
    gpu1 = "\n".join([_finalize_line("bert_tiny_sync", "bert_tiny_sync_0_0", n) for n in (200, 400)])
    doc: dict[str, Any] = {
        "variants": [{"label": "A", "config": {"instance_group": [{"count": 1}]}}],
        "runs": [
            {"variant": "A", "model_name": "bert_tiny_sync", "round": 1},
            {"variant": "A", "model_name": "bert_tiny_sync", "round": 2},
        ],
        "summary": [{"variant": "A"}],
    }
    assert st.attach_executor_stats(doc, [gpu0, gpu1]) == 2
    first, second = (r["executor"] for r in doc["runs"])
    assert first["instances"] == 2 and first["batches"] == 100 + 200
    assert second["instances"] == 2 and second["batches"] == 300 + 400
    # the same logs joined would pair the wrong records: why the runner passes one text per server
    joined: dict[str, Any] = json.loads(json.dumps(doc))
    st.attach_executor_stats(joined, gpu0 + "\n" + gpu1)
    assert joined["runs"][0]["executor"]["batches"] == 100  # one record: server 0's run 1 alone


def test_the_runs_one_load_served_share_its_records_whatever_the_model_names() -> None:
    """A fixed-rate round serves every rate from one load: three variants of one model name, two rates each.

    Taking records run by run gave the second rate of the first variant the second variant's load (the same
    model name), and every later run the records of a load after its own.
    """
    log = "\n".join(_finalize_line("bert_tiny_sync", "bert_tiny_sync_0_0", n) for n in (100, 200, 300, 400))
    runs = [
        {"variant": v, "model_name": "bert_tiny_sync", "round": r, "rate": rate, "load_s": load_s}
        for v, r, load_s in (("A", 1, 40.0), ("B", 1, 21.0), ("C", 1, 17.0), ("A", 2, 18.0))
        for rate in (850.0, 2100.0)
    ]
    doc: dict[str, Any] = {
        "variants": [{"label": v, "config": {"instance_group": [{"count": 1}]}} for v in "ABC"],
        "runs": runs,
        "summary": [{"variant": v} for v in "ABC"],
    }
    assert st.attach_executor_stats(doc, log) == 8
    assert [r["executor"]["batches"] for r in doc["runs"]] == [100, 100, 200, 200, 300, 300, 400, 400]
    a, b, c = (s["executor"] for s in doc["summary"])
    assert (a["batches"], b["batches"], c["batches"]) == (250.0, 200, 300)  # A: its two loads, each once


def _sleeper_with_a_stub(tmp_path: Path, burn_s: float) -> subprocess.Popen[bytes]:
    """A "server": burns ``burn_s`` of CPU, with a child named like Triton's stub; both then sleep."""
    stub = tmp_path / cpu.STUB_NAME
    if not stub.exists():
        stub.symlink_to(Path(sys.executable).resolve())
    script = (
        "import subprocess, time\n"
        f"p = subprocess.Popen([{str(stub)!r}, '-c', 'import time; time.sleep(60)'])\n"
        "t = time.process_time()\n"
        f"while time.process_time() - t < {burn_s}: pass\n"
        "time.sleep(60)\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_cpu_and_stub_memory_cover_every_servers_tree(tmp_path: Path) -> None:
    servers = [_sleeper_with_a_stub(tmp_path, 0.3), _sleeper_with_a_stub(tmp_path, 0.3)]
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            each = [cpu.snapshot(p.pid) for p in servers]
            if all((s.server_s or 0) >= 0.29 for s in each) and cpu.stub_memory([p.pid for p in servers])["stubs"] == 2:
                break
            time.sleep(0.05)
        pids = [p.pid for p in servers]
        # the sleepers may still be burning CPU: the snapshot of both lies between the sums taken around it
        before = [cpu.snapshot(pid) for pid in pids]
        both = cpu.snapshot(pids)
        each = [cpu.snapshot(pid) for pid in pids]
        memory = cpu.stub_memory(pids)
    finally:
        _stop(servers)
    assert both.server_s is not None and all(s.server_s is not None for s in [*before, *each])
    assert sum(s.server_s or 0 for s in before) - 0.02 <= both.server_s <= sum(s.server_s or 0 for s in each) + 0.02
    assert both.server_s >= 0.55
    assert set(both.threads) >= set(pids)  # a process's main thread id is its pid
    assert memory["stubs"] == 2 and memory["rss_bytes"] == sum(memory["rss"]) > 0
    assert cpu.snapshot([]).server_s is None and cpu.stub_memory([])["stubs"] == 0


# -- the report ----------------------------------------------------------------------------------


def test_report_states_the_deployment_and_each_servers_share() -> None:
    servers = [{"gpu": 0, "cpus": "0-9"}, {"gpu": 1, "cpus": "10-19"}]
    assert report.deployment_line(servers) == "2 servers, one per GPU: GPU 0 on cores 0-9, GPU 1 on cores 10-19"
    assert report.deployment_line([{"gpu": 1, "cpus": ""}]) == "1 server, one per GPU: GPU 1 not pinned"
    assert report.deployment_line([{"gpu": 0, "cpus": "0"}, {"gpu": 1, "cpus": "1"}]).endswith("GPU 1 on core 1")
    doc: dict[str, Any] = {
        "id": "ab-x",
        "valid": True,
        "summary": [],
        "runs": [],
        "variants": [],
        "server": {"per_gpu_servers": servers, "per_server_requests": [300, 100]},
        "load": {**presets.smoke().to_dict(), "user_class": "u", "cpu_sets": ol.split_cpus(range(32)).to_dict()},
    }
    md = report.markdown(doc)
    assert (
        "- deployment: 2 servers, one per GPU: GPU 0 on cores 0-9, GPU 1 on cores 10-19 (`--server-per-gpu 0,1`)" in md
    )
    assert "GPU 0 300 (75%), GPU 1 100 (25%)" in md
    del doc["server"]["per_gpu_servers"]
    assert "deployment" not in report.markdown(doc)  # one server: the header as before
