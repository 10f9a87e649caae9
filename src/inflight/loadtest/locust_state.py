"""The state of one Locust process of the load test: its prepared requests, their references, its raw latencies.

``loadtest/locustfile.py`` holds one :class:`LocustProcess` (``STATE``), prepares it from Locust's parsed
options at init (or test start) and reads it in its users. Imported by the locustfile after ``locust``, which
monkey-patches the standard library with gevent first (this module's ``subprocess`` is then gevent's).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import subprocess
import tempfile
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent.lock
import numpy as np

from inflight.errors import ConfigError
from inflight.loadtest import checks
from inflight.loadtest import openloop as ol
from inflight.loadtest import workload as wl

if TYPE_CHECKING:
    from locust.env import Environment

LOGGER = logging.getLogger("inflight.locustfile")


class LocustProcess:
    """Per-process state: the prepared requests, their references, and the raw latencies."""

    def __init__(self) -> None:
        self.workload: wl.Workload | None = None
        self.key: tuple[wl.Workload, bool, str, str] | None = None
        self.lock = gevent.lock.Semaphore()
        self.http: list[wl.HttpRequest] = []
        self.grpc: list[Any] = []
        self.references: list[dict[str, np.ndarray]] | None = None
        self.tol = wl.DEFAULT_TOLERANCE
        self.latencies: array[float] = array("d")
        self.raw_dir: Path | None = None
        self.next_start = 0
        self.sources: list[ol.Lateness] = []  # one per open-loop user of this process

    def prepare(self, options: argparse.Namespace) -> bool:
        """Build the pool (bodies, gRPC messages, references) from the parsed options.

        With ``--pool-file`` the inputs and references come from that file (the A/B runner writes
        it once, so that no Locust process imports torch). Otherwise the inputs are drawn here and,
        for ``--check``, the references computed by a separate Python process (torch and gevent do
        not mix, and a blocked Locust process misses the master's heartbeats).

        Returns:
            False when the pool for these options was already prepared.

        Raises:
            ConfigError: for invalid options or a pool file made for another workload.
        """
        w = wl.Workload.of(options.model, options)
        key = (w, bool(options.check), str(options.repository), str(options.pool_file))
        with self.lock:  # test_start may come while init still prepares
            if key == self.key:
                return False
            if options.pool_file:
                pool = wl.load_pool(Path(options.pool_file))
                w = dataclasses.replace(w, config=pool.workload.config)  # a model not built in: its config
                w.check()
                # a pool serves every variant of its base model (bert_tiny_sync, bert_tiny_inflight...)
                same_model = pool.workload.spec.name == w.spec.name
                if not same_model or dataclasses.replace(pool.workload, model=w.model) != w:
                    raise ConfigError(
                        f"--pool-file {options.pool_file} holds requests for {pool.workload}, but the options ask "
                        f"for {w}; pass matching options or drop --pool-file"
                    )
                if options.check and pool.references is None:
                    raise ConfigError(f"--check: --pool-file {options.pool_file} has no reference outputs")
            elif options.check:
                pool = pool_from_subprocess(w, Path(options.repository))
                w = pool.workload
            else:
                w = dataclasses.replace(w, config=wl.model_config(Path(options.repository), w.model))
                pool = wl.build_pool(w)
            spec = w.spec
            self.http = [wl.http_request(spec, x) for x in pool.inputs]
            self.grpc = [wl.grpc_request(spec, w.model, x) for x in pool.inputs]
            self.references = pool.references if options.check else None
            self.tol = wl.tolerance_for(w.model)
            self.workload = w
            self.key = key
        LOGGER.info(
            "prepared %d requests of %d items for %s (%d bytes each over HTTP)%s",
            len(pool.inputs),
            w.items,
            w.model,
            len(self.http[0].body),
            ", with reference outputs" if self.references is not None else "",
        )
        return True

    def options_for(self, environment: Environment) -> argparse.Namespace:
        """The run's parsed options, with the pool prepared for them.

        A ``run_single_user()`` debug session fires no test_start, so the first user prepares it.
        """
        options = environment.parsed_options
        assert options is not None, "Locust parses its options before any user starts"
        if self.workload is None:
            self.prepare(options)
        return options

    def start_index(self) -> int:
        """Spread users over the pool: each starts at the next entry."""
        i = self.next_start
        self.next_start = (i + 1) % max(1, len(self.http))
        return i

    def check(self, get: Any, available: Any, index: int) -> str | None:
        """Check one decoded response against the workload (and the reference with --check)."""
        w = self.workload
        assert w is not None
        ref = self.references[index] if self.references is not None else None
        return checks.check_output(w.spec, w.items, get, available, ref, self.tol)

    def write_latencies(self) -> None:
        """Write the raw latencies of this process (idempotent: the same file each time)."""
        if self.raw_dir is None:
            return
        self.raw_dir.mkdir(parents=True, exist_ok=True)
        path = self.raw_dir / f"latencies-{socket.gethostname()}-{os.getpid()}.f64"
        np.frombuffer(self.latencies, dtype=np.float64).astype("<f8").tofile(path)
        LOGGER.info("wrote %d raw latencies to %s", len(self.latencies), path)
        if self.sources:
            counts = [s.to_dict() for s in self.sources]
            (self.raw_dir / f"openloop-{socket.gethostname()}-{os.getpid()}.json").write_text(json.dumps(counts))


def pool_from_subprocess(w: wl.Workload, repository: Path) -> wl.Pool:
    """The pool of ``w`` with reference outputs, computed by a separate Python process (torch and gevent do not mix).

    Raises:
        ConfigError: when that process fails (its error output is in the message).
    """
    with tempfile.TemporaryDirectory(prefix="inflight-pool-") as tmp:
        out = Path(tmp) / "pool.npz"
        cmd = wl.pool_command(w, out=out, repository=repository, check=True)
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)  # gevent's: cooperative
        if r.returncode != 0:
            raise ConfigError(f"computing the reference outputs failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
        return wl.load_pool(out)
