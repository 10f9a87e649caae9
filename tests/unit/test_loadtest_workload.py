"""Unit tests of the load test's requests, checks, presets and Locust command line (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inflight.errors import ConfigError
from inflight.loadtest import checks, presets
from inflight.loadtest import workload as wl
from inflight.loadtest.runner.config import Endpoints, resolve_variants
from inflight.loadtest.runner.document import finite
from inflight.loadtest.runner.plan import locust_command
from inflight.models import get_model

ROOT = Path(__file__).resolve().parents[2]
BERT = get_model("bert_tiny")


def test_full_lengths_use_every_position() -> None:
    x = wl.draw_inputs(BERT, 8, seq_len=16, rng=np.random.default_rng(0))
    assert x["input_ids"].shape == x["attention_mask"].shape == (8, 16)
    assert x["input_ids"].dtype == x["attention_mask"].dtype == np.int64
    assert (x["attention_mask"] == 1).all() and (x["input_ids"] >= 1).all()
    assert BERT.validate(x) == 8


def test_uniform_lengths_pad_with_zeros() -> None:
    x = wl.draw_inputs(BERT, 500, seq_len=32, length_dist="uniform", rng=np.random.default_rng(1))
    lengths = x["attention_mask"].sum(1)
    assert lengths.min() >= 1 and lengths.max() <= 32 and len(set(lengths.tolist())) > 20
    # padding is a suffix: id 0, mask 0
    assert ((x["input_ids"] == 0) == (x["attention_mask"] == 0)).all()
    assert (np.diff(x["attention_mask"], axis=1) <= 0).all()
    BERT.validate(x)


def test_zipf_tokens_favour_frequent_ids() -> None:
    rng = np.random.default_rng(2)
    z = wl.draw_inputs(BERT, 200, seq_len=64, token_dist="zipf", rng=rng)["input_ids"]
    u = wl.draw_inputs(BERT, 200, seq_len=64, token_dist="uniform", rng=rng)["input_ids"]
    assert z.min() >= 1 and z.max() < BERT.vocab_size  # type: ignore[operator]
    assert (z <= 10).mean() > 0.2 > (u <= 10).mean()


def test_heads_get_features() -> None:
    spec = get_model("linear_head")
    x = wl.Workload(model="linear_head_sync", items=3).inputs(0)
    assert x["features"].shape == (3, 1024) and x["features"].dtype == np.float32
    assert spec.validate(x) == 3


def test_pool_is_the_same_for_every_variant() -> None:
    a = wl.Workload(model="bert_tiny_sync", items=4, seq_len=16, seed=3).pool_inputs()
    b = wl.Workload(model="bert_tiny_inflight", items=4, seq_len=16, seed=3).pool_inputs()
    c = wl.Workload(model="bert_tiny_inflight", items=4, seq_len=16, seed=4).pool_inputs()
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0]["input_ids"], c[0]["input_ids"])
    assert not np.array_equal(a[0]["input_ids"], a[1]["input_ids"])


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"items": 0}, "--items 0"),
        ({"items": 5000}, "max_batch_size"),
        ({"seq_len": 513}, "--seq-len 513"),
        ({"token_dist": "normal"}, "--token-dist"),
        ({"length_dist": "zipf"}, "--length-dist"),
        ({"model": "resnet_sync"}, "unknown model"),
    ],
)
def test_workload_errors_name_the_option(changes: dict[str, object], match: str) -> None:
    base = {"model": "bert_tiny_sync", "items": 4, "seq_len": 16}
    with pytest.raises(ConfigError, match=match):
        wl.Workload(**{**base, **changes}).check()  # type: ignore[arg-type]


def test_http_body_is_binary_kserve_v2() -> None:
    x = wl.Workload(model="bert_tiny_sync", items=4, seq_len=16).inputs(0)
    req = wl.http_request(BERT, x)
    n = int(req.headers["Inference-Header-Content-Length"])
    assert req.headers["Accept-Encoding"] == "identity"
    header = json.loads(req.body[:n])
    assert [i["name"] for i in header["inputs"]] == ["input_ids", "attention_mask"]
    assert all(i["datatype"] == "INT64" and i["shape"] == [4, 16] for i in header["inputs"])
    assert header["outputs"] == [{"name": "cls", "parameters": {"binary_data": True}}]
    assert req.body[n:] == x["input_ids"].tobytes() + x["attention_mask"].tobytes()


def test_grpc_request_carries_raw_tensors() -> None:
    x = wl.Workload(model="bert_tiny_inflight", items=2, seq_len=8).inputs(1)
    req = wl.grpc_request(BERT, "bert_tiny_inflight", x)
    assert req.model_name == "bert_tiny_inflight"
    assert [(i.name, i.datatype, list(i.shape)) for i in req.inputs] == [
        ("input_ids", "INT64", [2, 8]),
        ("attention_mask", "INT64", [2, 8]),
    ]
    assert list(req.raw_input_contents) == [x["input_ids"].tobytes(), x["attention_mask"].tobytes()]
    assert [o.name for o in req.outputs] == ["cls"]


def _getter(out: dict[str, tuple[np.ndarray, str]]):  # type: ignore[no-untyped-def]
    return (lambda name: out.get(name, (None, None))), (lambda: list(out))


def test_check_output_messages() -> None:
    good = np.zeros((4, 128), np.float32)
    tol = wl.tolerance_for("bert_tiny_sync")
    assert checks.check_output(BERT, 4, *_getter({"cls": (good, "FP32")})) is None
    assert "missing" in str(checks.check_output(BERT, 4, *_getter({"other": (good, "FP32")})))
    assert "expected FP32" in str(checks.check_output(BERT, 4, *_getter({"cls": (good.astype(np.float16), "FP16")})))
    assert "expected [4, 128]" in str(checks.check_output(BERT, 4, *_getter({"cls": (good[:3], "FP32")})))
    ref = {"cls": good + 0.01}
    assert checks.check_output(BERT, 4, *_getter({"cls": (good, "FP32")}), ref, tol) is None
    ref = {"cls": good.copy()}
    ref["cls"][2, 7] = 1.0
    msg = str(checks.check_output(BERT, 4, *_getter({"cls": (good, "FP32")}), ref, tol))
    assert "differs from the PyTorch reference" in msg and "worst at [2, 7]" in msg


def test_tolerance_scaled_for_small_logits() -> None:
    tol = wl.tolerance_for("linear_head_inflight")
    ref = np.array([[0.03, -0.02]], np.float32)
    assert checks.compare(ref * 1.01, ref, tol) is None
    assert checks.compare(ref + 0.01, ref, tol) is not None  # 0.01 is a third of the logits
    assert "NaN" in str(checks.compare(ref * np.nan, ref, tol))


def test_pool_file_roundtrip(tmp_path: Path) -> None:
    w = wl.Workload(model="bert_tiny_sync", items=3, seq_len=8, pool=4)
    pool = wl.build_pool(w)
    path = wl.save_pool(pool, tmp_path / "pool.npz")
    back = wl.load_pool(path)
    assert back.workload == w and back.references is None
    for a, b in zip(pool.inputs, back.inputs, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    refs = [{"cls": np.full((3, 128), i, np.float32)} for i in range(4)]
    wl.save_pool(wl.Pool(workload=w, inputs=pool.inputs, references=refs), path)
    assert [r["cls"][0, 0] for r in wl.load_pool(path).references or []] == [0, 1, 2, 3]
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(ConfigError, match="cannot read"):
        wl.load_pool(tmp_path / "bad.npz")
    with pytest.raises(ConfigError, match="--check needs --repository"):
        wl.build_pool(w, check=True)
    with pytest.raises(ConfigError, match="--check needs the model artifact"):
        wl.build_pool(w, check=True, repository=tmp_path)


def test_presets() -> None:
    p = presets.preset("published")
    assert (p.users, p.items, p.window_s, p.seq_len) == (1000, 50, 120, 64)
    assert 1 <= p.processes <= 8
    s = presets.preset("smoke")
    assert (s.users, s.window_s) == (20, 10)
    assert s.replace(users=None, items=4).items == 4
    with pytest.raises(ConfigError, match="choose one of"):
        presets.preset("huge")
    with pytest.raises(ConfigError, match="--window"):
        s.replace(window_s=0.5).check_values()


def test_locust_command(tmp_path: Path) -> None:
    shape = presets.smoke().replace(processes=3, check=True, protocol="grpc")
    cmd = locust_command(
        locustfile=tmp_path / "locustfile.py",
        shape=shape,
        model="bert_tiny_sync",
        endpoints=Endpoints(http="127.0.0.1:8000", grpc="127.0.0.1:8001", metrics="m"),
        duration_s=10.2,
        pool_file=tmp_path / "pool.npz",
        repository=tmp_path,
        csv_prefix=tmp_path / "A-r1",
        raw_dir=tmp_path / "raw",
    )
    joined = " ".join(cmd)
    for part in (
        "--headless",
        "-u 20",
        "-t 11s",
        "--reset-stats",
        "--only-summary",
        # users finish the request in flight when the time is up: no connection dropped mid-request
        "--stop-timeout 10",
        "--processes 3",
        "--check",
        "--model bert_tiny_sync",
        "--grpc-url 127.0.0.1:8001",
        "--host http://127.0.0.1:8000",
    ):
        assert part in joined
    assert cmd[-1] == "TritonGrpcUser"
    # the master's port is chosen per run (Locust's fixed 5557 broke A/B runs side by side), workers follow it
    port = cmd[cmd.index("--master-bind-port") + 1]
    assert cmd[cmd.index("--master-port") + 1] == port and int(port) > 0


def test_variants_from_the_repository() -> None:
    vs = resolve_variants(
        ["bert_tiny_sync@instances=4,delay_us=250,preferred=512/1024", "bert_tiny_inflight@slots=2"],
        ROOT / "model_repository",
    )
    assert [(v.label, v.name) for v in vs] == [("A", "bert_tiny_sync"), ("B", "bert_tiny_inflight")]
    a = vs[0].config
    assert (a.batching.instances, a.batching.max_queue_delay_us, a.batching.preferred_batch_sizes) == (
        4,
        250,
        (512, 1024),
    )
    assert vs[1].config.params.slots == 2
    with pytest.raises(ConfigError, match="at least one variant"):
        resolve_variants([], ROOT / "model_repository")
    with pytest.raises(ConfigError, match="unknown key"):
        resolve_variants(["bert_tiny_sync@bogus=1"], ROOT / "model_repository")


def test_finite_json() -> None:
    assert finite({"a": [float("nan"), 1.5, {"b": float("inf")}], "c": "x"}) == {
        "a": [None, 1.5, {"b": None}],
        "c": "x",
    }


def test_cli_commands(tmp_path: Path) -> None:
    import shutil

    import typer
    from typer.testing import CliRunner

    from inflight.loadtest.cli import register

    app = typer.Typer()
    register(app)
    cli = CliRunner()
    assert "--preset" in cli.invoke(app, ["ab", "--help"]).output
    src = tmp_path / "ab-smoke.json"
    shutil.copy(Path(__file__).parent / "fixtures" / "ab-smoke.json", src)
    r = cli.invoke(app, ["ab-report", str(src)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ab-smoke.md").is_file() and (tmp_path / "ab-smoke-latency.png").is_file()
    r = cli.invoke(app, ["ab", "bert_tiny_sync", "--preset", "huge"])
    assert r.exit_code == 2 and "unknown preset 'huge'" in r.output
    r = cli.invoke(app, ["ab", "bert_tiny_sync", "--repository", str(tmp_path)])
    assert r.exit_code == 2 and "run `inflight build-models` first" in r.output
