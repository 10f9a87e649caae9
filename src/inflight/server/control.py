"""Model control and statistics over HTTP, through tritonclient.

A variant is loaded under its own name with a config override (Triton's model-control API takes
the whole config as JSON), so one server can serve ``bert_tiny_sync`` with 1, 2, 4 or 8 instances
in turn without touching the repository.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inflight.tool_errors import ServerError
from inflight.variants import VariantConfig, apply_overrides, parse_pbtxt, variant_from_proto

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

LOGGER = logging.getLogger(__name__)


def http_client(url: str, **kwargs: Any) -> Any:
    """A ``tritonclient.http.InferenceServerClient`` for ``host:port``."""
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, **kwargs)


def variant_config(
    repository: Any, name: str, overrides: Mapping[str, str] | None = None, config: mc.ModelConfig | None = None
) -> VariantConfig:
    """Read ``<repository>/<name>/config.pbtxt`` and apply ``overrides`` (see ``apply_overrides``).

    ``config``: the model's config already parsed, when the caller has read it (then the file is not read).
    """
    from pathlib import Path

    if config is None:
        path = Path(repository) / name / "config.pbtxt"
        if not path.is_file():
            raise ServerError(f"{path} not found; run `inflight build-models` first")
        config = parse_pbtxt(path.read_text())
    vc = variant_from_proto(config)
    return apply_overrides(vc, overrides) if overrides else vc


def load_variant(url: str, vc: VariantConfig, timeout_s: float = 600.0) -> float:
    """Load (or reload) ``vc`` under its name with its config as an override; return seconds taken.

    Raises:
        ServerError: with the server's message when loading fails.
    """
    return load_config(url, vc.model_name, vc.to_json(), timeout_s)


def load_config(url: str, name: str, config_json: str, timeout_s: float = 600.0) -> float:
    """Load (or reload) ``name`` with ``config_json`` (Triton's JSON form) as its config; return seconds taken.

    Raises:
        ServerError: with the server's message when loading fails.
    """
    from tritonclient.utils import InferenceServerException

    client = http_client(url, network_timeout=timeout_s, connection_timeout=timeout_s)
    t0 = time.perf_counter()
    try:
        client.load_model(name, config=config_json)
    except InferenceServerException as e:
        raise ServerError(f"loading {name} failed: {e.message()}") from None
    finally:
        client.close()
    return time.perf_counter() - t0


def unload(url: str, name: str, timeout_s: float = 300.0) -> None:
    """Unload ``name`` and wait until it is gone (finalize() has returned)."""
    client = http_client(url, network_timeout=max(timeout_s, 10.0))
    try:
        client.unload_model(name)
    finally:
        client.close()
    wait_unloaded(url, name, timeout_s)


def wait_unloaded(url: str, name: str, timeout_s: float) -> None:
    """Wait until ``name`` is no longer loaded (after an unload request); ServerError after ``timeout_s``."""
    client = http_client(url, network_timeout=max(timeout_s, 10.0))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            index = {m["name"]: m.get("state") for m in client.get_model_repository_index()}
            if index.get(name) not in ("READY", "UNLOADING", "LOADING"):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        raise ServerError(f"{name} still loaded {timeout_s:.0f} s after unload")
    finally:
        client.close()


def inference_stats(url: str, name: str) -> dict[str, Any]:
    """``GET /v2/models/<name>/stats`` → the first model_stats entry (cumulative counters)."""
    client = http_client(url)
    try:
        stats = client.get_inference_statistics(name)
    finally:
        client.close()
    entries = stats.get("model_stats", [])
    if not entries:
        raise ServerError(f"no statistics for {name}; is it loaded?")
    return dict(entries[0])
