"""Faults under load (issue 32, item 5): what the server does with every request when something breaks.

Each fault runs against its own ``inflight serve`` child process (``bert_tiny_inflight`` at two
instances by default: the pipelined path, responses through ``send()``). Its capacity is measured
first (clients sending back to back), then an open loop sends Poisson arrivals at half of it while
the fault hits:

* ``a``: SIGTERM to ``inflight serve``; the replacement (a new ``inflight serve``) must answer correctly;
* ``b``: SIGKILL to one instance's ``triton_python_backend_stub`` (a child of tritonserver, found
  through /proc); what Triton does is recorded, and when the model does not answer correctly
  afterwards, the recovery (an unload and reload of the model) is done and recorded;
* ``c``: the model unloaded and loaded again (with the same configuration) through the model-control API;
* ``d``: 1% of the requests sent on a raw socket that is closed before the answer is read
  (half with a FIN, half with a RST); the stubs' resident memory (VmRSS) is sampled meanwhile.

Every request sent (but the deliberately dropped ones of ``d``) must be answered, or failed with an
error that says what happened, within :data:`ANSWER_WITHIN_S`: lost (neither) = 0 is the target.
Afterwards the server (or its replacement) must answer correctly (the same output as before the
fault) and no slot may stay busy (the backend's ``inflight_in_flight`` gauge of every instance that
ran a probe batch, and Triton's ``nv_inference_pending_request_count``, are 0).

``python -m inflight.lab.faults --out DIR`` writes ``faults.json`` there. The sittings under ``results/faults`` are
on docs/RESULTS-archive.md ("Faults under load"), frozen: a new one there reopens that section
(:mod:`inflight.lab.archive`). The server under test is :mod:`inflight.lab.serve_process`'s, the load
:mod:`inflight.lab.fault_load`'s.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inflight.lab.fault_load import (
    ANSWER_WITHIN_S,
    DEFAULT_FAULT_AT_S,
    SEQ,
    Outcome,
    busy_after,
    capacity,
    check_answers,
    open_loop,
    output,
    samples,
    serving,
    tally,
)
from inflight.lab.serve_process import RSS_FLAT_MIB, SRC, RssSampler, ServeProcess, log_lines, model_ready, rss_flat
from inflight.loadtest.openloop import format_cpus
from inflight.loadtest.runner.document import device_info, package_version, versions
from inflight.server.config import port_free
from inflight.tool_errors import ServerError

#: What the driver's users (its tests, the server's test helper) import from here.
__all__ = [
    "ANSWER_WITHIN_S",
    "FAULTS",
    "RSS_FLAT_MIB",
    "FaultConfig",
    "Outcome",
    "ServeProcess",
    "main",
    "rss_flat",
    "run_fault",
    "run_sitting",
    "samples",
    "section_rows",
    "tally",
]

#: The open loop's rate as a share of the measured capacity.
RATE_SHARE = 0.5
#: The share of requests whose client disconnects before reading the answer (fault d).
DISCONNECT_SHARE = 0.01
DEFAULT_MODEL = "bert_tiny_inflight"
DEFAULT_INSTANCES = 2
FAULTS = {
    "a": "SIGTERM to inflight serve",
    "b": "kill -9 of one instance's stub",
    "c": "unload and reload of the model",
    "d": "1% of clients disconnecting mid-request",
}
#: Seconds of open loop per fault and when the fault hits (d: the disconnects run the whole time).
DEFAULT_LOAD_S = {"a": 10.0, "b": 20.0, "c": 16.0, "d": 120.0}
#: How long the recovery of (b) waits for the unload before it replaces the server instead.
RELOAD_TIMEOUT_S = 60.0


@dataclass
class FaultConfig:
    """What one sitting runs: the model variant, the open loop's lengths, where the servers run."""

    repository: Path
    workdir: Path
    model: str = DEFAULT_MODEL
    instances: int = DEFAULT_INSTANCES
    load_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LOAD_S))
    fault_at_s: float = DEFAULT_FAULT_AT_S
    capacity_s: float = 4.0
    capacity_clients: int = 8
    server_cpus: str | None = None
    serve_args: tuple[str, ...] = ()
    reload_timeout_s: float = RELOAD_TIMEOUT_S

    @property
    def spec(self) -> str:
        """``inflight serve``'s ``-m`` argument."""
        return f"{self.model}@instances={self.instances}"

    def serve_extra(self) -> tuple[str, ...]:
        """More ``inflight serve`` arguments (``--cpus``)."""
        return (("--cpus", self.server_cpus) if self.server_cpus else ()) + self.serve_args

    def as_dict(self) -> dict[str, Any]:
        """The configuration as the JSON file records it."""
        return {
            "model": self.model,
            "instances": self.instances,
            "serve_model_arg": self.spec,
            "load_s": self.load_s,
            "fault_at_s": self.fault_at_s,
            "rate_share_of_capacity": RATE_SHARE,
            "capacity_s": self.capacity_s,
            "capacity_clients": self.capacity_clients,
            "answer_within_s": ANSWER_WITHIN_S,
            "disconnect_share": DISCONNECT_SHARE,
            "rss_flat_mib": RSS_FLAT_MIB,
            "request": f"input_ids and attention_mask [1, {SEQ}] INT64; answer: cls [1, 128] FP32",
            "server_cpus": self.server_cpus,
            "reload_timeout_s": self.reload_timeout_s,
        }


def _reload(cfg: FaultConfig, http: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Unload the model and load it again with the sitting's configuration; what happened and how long it took."""
    from inflight.server import control

    t0 = time.monotonic()
    out: dict[str, Any] = {}
    try:
        control.unload(http, cfg.model, timeout_s=timeout_s)
        out["unload_s"] = time.monotonic() - t0
        vc = control.variant_config(cfg.repository, cfg.model, {"instances": str(cfg.instances)})
        out["load_s"] = control.load_variant(http, vc, timeout_s=timeout_s)
        out["ok"] = True
    except Exception as e:  # recorded: the sitting says what the reload did
        out["ok"] = False
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["seconds"] = time.monotonic() - t0
    return out


def run_fault(key: str, cfg: FaultConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run fault ``key`` (``a``...``d``) against a fresh ``inflight serve``; its result block.

    The block holds the open loop's counts (:func:`tally`), the rate, the recovery check (the model's answers
    afterwards, from the replacement server for ``a``), the busy slots afterwards (:func:`busy_after`), what the
    server did (``a``: exit status and processes left; ``b``: the stubs before and after, the model's
    readiness, the server log's lines about the stub, the reload when one was needed), and for ``d`` the
    stubs' RSS samples and whether they stayed flat (:func:`rss_flat`).
    """
    if key not in FAULTS:
        raise ValueError(f"unknown fault {key!r}: use one of {', '.join(FAULTS)}")
    workdir = cfg.workdir / f"fault-{key}"
    if workdir.exists():
        shutil.rmtree(workdir)
    seconds = cfg.load_s[key]
    result: dict[str, Any] = {"fault": key, "name": FAULTS[key], "load_s": seconds}
    with serving(cfg.repository, workdir / "server", cfg.spec, *cfg.serve_extra()) as s:
        reference = output(s.http, cfg.model)
        cap = capacity(s.http, cfg.model, cfg.capacity_s, cfg.capacity_clients)
        if cap <= 0:
            raise ServerError(f"no request answered while measuring the capacity of {cfg.spec}")
        rate = RATE_SHARE * cap
        result.update(capacity_rps=cap, rate_rps=rate)
        log(f"fault {key} ({FAULTS[key]}): capacity {cap:.1f} req/s, offering {rate:.1f} req/s for {seconds:.0f} s")
        stubs_before = s.stubs(cfg.model)
        log_path = workdir / "server" / "tritonserver.log"
        log_at = log_path.stat().st_size if log_path.is_file() else 0
        times: dict[str, float] = {}
        replace = key == "a"
        notes: dict[str, Any] = {"stubs_before": stubs_before}

        def sigterm() -> None:
            times["fault"] = time.monotonic()
            s.proc.send_signal(signal.SIGTERM)

        def kill_stub() -> None:
            name, pid = sorted(stubs_before.items())[-1]
            times["fault"] = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            notes["killed"] = {"instance": name, "pid": pid}

        def reload() -> None:
            times["fault"] = time.monotonic()
            notes["reload"] = _reload(cfg, s.http)
            times["loaded"] = time.monotonic()

        fault: Callable[[], None] | None = {"a": sigterm, "b": kill_stub, "c": reload}.get(key)
        if key == "d":
            times["fault"] = time.monotonic()
            with RssSampler(s, cfg.model) as sampler:
                outcomes = open_loop(s.http, cfg.model, rate, seconds, disconnect_share=DISCONNECT_SHARE)
            result["rss"] = {"samples": sampler.samples, **rss_flat(sampler.series())}
        else:
            # (c) goes on until 4 s after the reload finished, so that requests after it are measured
            def until_reloaded() -> bool:
                return key == "c" and ("loaded" not in times or time.monotonic() < times["loaded"] + 4.0)

            outcomes = open_loop(
                s.http, cfg.model, rate, seconds, fault=fault, fault_at_s=cfg.fault_at_s, extend=until_reloaded
            )
        result.update(tally(outcomes, times.get("fault")))
        if "fault" in times and key != "d":
            after = [o for o in outcomes if o.due > times["fault"] + 5 and not o.dropped]
            result["after_fault_5s"] = dict(collections.Counter(o.kind for o in after))
        if "loaded" in times:
            after = [o for o in outcomes if o.due > times["loaded"] + 0.5]
            result["after_reload"] = dict(collections.Counter(o.kind for o in after))
        log(
            f"fault {key}: sent {result['sent']}, answered {result['answered']}, failed {result['failed']}, "
            f"lost {result['lost']}, dropped {result['dropped']}; failures {result['failures_by_kind']}"
        )
        if key == "a":
            code = s.wait_exit(60)
            result["server"] = {
                "serve_exit_code": code,
                "clean_stop_line": "tritonserver stopped (exit code 0)" in s.text(),
                "processes_left": s.left(),
                "ports_free": all(port_free(p) for p in s.ports),
            }
        else:
            if key == "b":
                notes["model_ready_after"] = model_ready(s.http, cfg.model)
                notes["stubs_after"] = s.stubs(cfg.model)
                notes["server_log"] = log_lines(log_path, log_at)
            check = check_answers(s.http, cfg.model, reference)
            recovery: dict[str, Any] = {"check": check, "how": "none needed" if check["ok"] else None}
            if not check["ok"] and key == "b":
                # Triton 2.51 does not restart the stub: the instance fails every request it gets until the model
                # is loaded again; the recovery tried first is an unload and reload
                result["busy_before_recovery"] = busy_after(s.http, s.metrics, cfg.model, rounds=1)
                recovery["reload"] = _reload(cfg, s.http, timeout_s=cfg.reload_timeout_s)
                recovery["how"] = "unload and reload of the model"
                if recovery["reload"]["ok"]:
                    recovery["check_after_reload"] = check = check_answers(s.http, cfg.model, reference)
                    notes["stubs_after_reload"] = s.stubs(cfg.model)
                else:
                    recovery["how"] = "unload and reload failed; a new inflight serve"
                    replace = True
            recovery["recovered"] = bool(check["ok"])
            result["recovery"] = recovery
            if not replace:
                result["busy_after"] = busy_after(s.http, s.metrics, cfg.model)
            code = s.stop(90)
            result["server"] = {
                "serve_exit_code": code,
                "clean_stop_line": "tritonserver stopped (exit code 0)" in s.text(),
                "stop_reason": next((line for _, line in s.out if "tritonserver stopped" in line), "").strip()[:400],
                "processes_left": s.left(),
            }
        result["notes"] = notes
        if "loaded" in times and "fault" in times:
            result["reload_s"] = times["loaded"] - times["fault"]
    if replace:  # a new inflight serve answers correctly and leaves no slot busy
        with serving(cfg.repository, workdir / "replacement", cfg.spec, *cfg.serve_extra()) as r:
            check = check_answers(r.http, cfg.model, reference)
            rec = result.setdefault("recovery", {"how": "a new inflight serve"})
            rec["check_replacement"] = check
            rec["recovered"] = bool(check["ok"])
            result["busy_after"] = busy_after(r.http, r.metrics, cfg.model)
            r.stop(90)
    return result


def _versions() -> dict[str, Any]:
    """The load test's versions (no server asked), the Triton wheel's and the checkout's commit."""
    out: dict[str, Any] = {**versions(None), "nvidia_pytriton": package_version("nvidia-pytriton")}
    try:
        out["git_commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=SRC, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["git_commit"] = None
    return out


def host_info() -> dict[str, Any]:
    """The host: name, OS, cores, this process's CPU set, and the device as the load test records it."""
    dev = device_info()
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "cpu_count": os.cpu_count(),
        "client_cpus": format_cpus(sorted(os.sched_getaffinity(0))),
        "device": dev["name"],
        "device_info": dev,
    }


def run_sitting(cfg: FaultConfig, out: Path, keys: Sequence[str], log: Callable[[str], None] = print) -> Path:
    """Run the faults ``keys`` one after the other; write ``out/faults.json`` after each; return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "faults.json"
    host = host_info()
    doc: dict[str, Any] = {
        "schema": 1,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host,
        "versions": _versions(),
        "cpu_sets": {"client": host["client_cpus"], "server": cfg.server_cpus},
        "config": cfg.as_dict(),
        "command": " ".join(["python -m inflight.lab.faults", *sys.argv[1:]]),
        "faults": [],
    }
    for key in keys:
        doc["faults"].append(run_fault(key, cfg, log))
        path.write_text(json.dumps(doc, indent=1) + "\n")
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m inflight.lab.faults``: run the faults and write ``faults.json``; exit 1 when one lost requests."""
    p = argparse.ArgumentParser(prog="python -m inflight.lab.faults", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="Folder for faults.json (results/faults/<date>-<device>).")
    p.add_argument("--faults", default="a,b,c,d", help="Which faults, comma-separated (default a,b,c,d).")
    p.add_argument("--duration-s", type=float, default=DEFAULT_LOAD_S["d"], help="Seconds of open loop for (d).")
    p.add_argument(
        "--load-s", type=float, default=None, help="Seconds of open loop for (a), (b), (c) (default 10, 20, 16)."
    )
    p.add_argument("--repository", type=Path, default=Path("model_repository"), help="Model repository.")
    p.add_argument("--workdir", type=Path, default=Path("runs/faults"), help="Servers' workdirs and logs.")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--instances", type=int, default=DEFAULT_INSTANCES)
    p.add_argument("--server-cpus", default=None, help="inflight serve --cpus (e.g. 0-7); default: all.")
    p.add_argument("--client-cpus", default=None, help="Cores for this process (the load), e.g. 8-15.")
    args = p.parse_args(argv)

    def stop(signum: int, _frame: object) -> None:  # the servers are stopped by the with blocks on the way out
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    keys = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in keys if k not in FAULTS]
    if unknown:
        p.error(f"unknown fault(s) {unknown}: use {', '.join(FAULTS)}")
    if args.client_cpus:
        from inflight.loadtest.list_options import parse_cpus

        os.sched_setaffinity(0, parse_cpus(args.client_cpus))
    from inflight.build.repository import ensure_built

    ensure_built(args.repository, [args.model.rsplit("_", 1)[0]])
    load_s = dict(DEFAULT_LOAD_S)
    if args.load_s is not None:
        load_s.update(a=args.load_s, b=args.load_s, c=args.load_s)
    load_s["d"] = args.duration_s
    cfg = FaultConfig(
        repository=args.repository.resolve(),
        workdir=args.workdir.resolve(),
        model=args.model,
        instances=args.instances,
        load_s=load_s,
        server_cpus=args.server_cpus,
    )
    path = run_sitting(cfg, args.out, keys, functools.partial(print, flush=True))
    doc = json.loads(path.read_text())
    print(f"wrote {path}")  # noqa: T201 - the command's output
    for line in section_rows(doc):
        print(line)  # noqa: T201
    return 1 if any(f["lost"] for f in doc["faults"]) else 0


def section_rows(doc: Mapping[str, Any]) -> list[str]:
    """One line per fault of a ``faults.json`` document: sent / answered / failed / lost / dropped."""
    return [
        f"({f['fault']}) {f['name']}: sent {f['sent']}, answered {f['answered']}, failed {f['failed']}, "
        f"lost {f['lost']}, dropped {f['dropped']}; recovered {_yes_no((f.get('recovery') or {}).get('recovered'))}"
        for f in doc.get("faults") or []
    ]


def _yes_no(v: bool | None) -> str:
    return "n/a" if v is None else "yes" if v else "no"


if __name__ == "__main__":
    sys.exit(main())
