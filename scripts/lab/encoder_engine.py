"""The encoder engine at one BERT shape (all-MiniLM-L6-v2's by default): what each rewrite is worth on a GPU.

Issue 53's engine work. Builds ``make_module`` at the shape (seeded random weights: the GPU's time
does not depend on their values; mean pooling and L2 normalization as the sentence-transformers
model), in fp16 on the GPU, compiled with inductor (dynamic shapes, as the served engine compiles
it), one call captured in a CUDA graph, and times replays with CUDA events:

- ``uniform``: 2,048 sequences of 64 tokens (tokens/s: the issue's figure);
- ``mixed``: 2,048 sequences of lengths uniform in 16-128, padded to 128 with the mask (tokens/s
  counts the real tokens);
- ``unpadded``: the same mixed batch laid end to end (``make_unpadded_module``, FlashAttention's
  variable-length kernel), real tokens/s.

Variants (``--variant``, repeatable; all but ``autotune`` by default): ``opaque_ffn`` (the
feed-forward block through the fused operator, which for a hidden size its kernel does not take ran
the unfused ops inside an operator the compiler cannot see into: the engine before issue 53),
``no_epilogue`` (served, but the first feed-forward GEMM's GELU as a pass of its own, which
inductor fuses with the bias), ``flash_varlen`` (served, but the unpadded launch's attention
FlashAttention's variable-length kernel), ``served`` (what ``make_module`` builds now), ``sdpa`` (no
custom kernels: PyTorch's attention), ``fp8`` (served with every linear layer in fp8 e4m3,
``torch._scaled_mm``, per-tensor scales: the weights' computed once, the activations' calibrated on the
uniform batch), ``fp8_dynamic`` (the same with each activation's scale computed per call),
``autotune`` (served, ``max-autotune-no-cudagraphs``: inductor's GEMM templates timed against cuBLAS).

``--fp8-accuracy CHECKPOINT`` (CPU, no timing): what fp8 costs a real checkpoint's embeddings. Its fp32 module,
and the same module with every linear layer in fp8 as above (scales calibrated on half the texts), embed the
sentences of the repository's docs; the cosine between the two over the other half.

Each variant's cosine against the fp32 module (unfused ops, TF32 off) over the mixed batch's first
256 sequences, and its 15 costliest kernels at ``uniform`` (``torch.profiler``). ``--attention``
also times the attention kernel's (heads per program, warps) grid against
``scaled_dot_product_attention`` and the memory floor (QKV read once, output written once, at the
card's bandwidth given by ``--bandwidth``).

Usage (GPU host): python3 scripts/lab/encoder_engine.py --out engine.json [--attention]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

VARIANTS = ("opaque_ffn", "no_epilogue", "flash_varlen", "served", "sdpa", "fp8", "fp8_dynamic", "autotune")
#: run when no --variant is named: fp8 (measured on its own, issue 53), fp8_dynamic (slower: its amax passes cost
#: more than its GEMMs save, H100 2026-11-27) and autotune (minutes of GEMM search; cuBLAS won every GEMM) were
#: measured once
DEFAULT_VARIANTS = VARIANTS[:4]
ROWS = 2048


def _options(variant: str) -> tuple[dict[str, Any], str]:
    """``make_module`` options and compile mode of a variant."""
    if variant == "opaque_ffn":
        return {"fused_ffn": True}, "default"
    if variant == "sdpa":
        return {"kernels": False}, "default"
    if variant == "autotune":
        return {}, "max-autotune-no-cudagraphs"
    return {}, "default"


@contextlib.contextmanager
def _patched(variant: str) -> Iterator[None]:
    """The kernels module with ``no_epilogue``'s or ``flash_varlen``'s operator swapped in (compile and timing)."""
    import torch

    from inflight.models import kernels as ops

    def flash(qkv: Any, cu: Any, max_len: int, heads: int) -> Any:
        t, three_h = qkv.shape
        q, k, v = qkv.view(t, 3, heads, three_h // 3 // heads).unbind(1)
        out = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False, False)[0]
        return out.reshape(t, three_h // 3)

    name: str | None = None
    repl: Any = None
    if variant == "no_epilogue":
        name, repl = "linear_gelu", ops.linear_gelu_reference
    elif variant == "flash_varlen":
        repl = flash

        name = "varlen_attention"
    if name is None:
        yield
        return
    saved = getattr(ops, name)
    setattr(ops, name, repl)
    try:
        yield
    finally:
        setattr(ops, name, saved)


def calibrate(module: Any, batches: list[list[Any]]) -> dict[str, float]:
    """The largest magnitude each ``nn.Linear`` of ``module`` reads over ``batches`` (its name: amax).

    ``module`` must call every linear layer as a module (``kernels=False``); its names are the served module's
    (``base.`` stripped, the unpadded wrapper's prefix).
    """
    import torch
    from torch import nn

    amax: dict[str, float] = {}
    hooks = []
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear):

            def hook(_m: Any, inputs: tuple[Any, ...], key: str = name.removeprefix("base.")) -> None:
                amax[key] = max(amax.get(key, 0.0), float(inputs[0].detach().abs().amax()))

            hooks.append(sub.register_forward_pre_hook(hook))
    try:
        with torch.inference_mode():
            for args in batches:
                module(*args)
    finally:
        for h in hooks:
            h.remove()
    return amax


def _fp8(module: Any, amax: dict[str, float] | None = None) -> Any:
    """Every ``nn.Linear`` of ``module`` in fp8 e4m3 (``torch._scaled_mm``), weights scaled per tensor once.

    Activations: with ``amax`` (from :func:`calibrate`) each layer's input scale is fixed, so quantizing it is one
    multiply and cast the compiler fuses into the op before (a layer norm, the GELU); without, it is computed per
    call (an amax reduction over the activation first: the variant ``fp8_dynamic``). The feed-forward block's
    first GEMM and its GELU become an fp8 GEMM and a GELU the compiler fuses with the next layer's quantization.
    """
    import types

    import torch
    from torch import nn
    from torch.nn import functional as F

    fp8 = torch.float8_e4m3fn
    top = torch.finfo(fp8).max

    class Fp8Linear(nn.Module):
        w: torch.Tensor
        w_scale: torch.Tensor
        bias: torch.Tensor | None
        x_scale: torch.Tensor
        x_inv: torch.Tensor

        def __init__(self, lin: nn.Linear, x_amax: float | None) -> None:
            super().__init__()
            w = lin.weight.detach().float()
            scale = w.abs().max().clamp(min=1e-12) / top
            self.register_buffer("w", (w / scale).to(fp8).t())  # column-major [in, out], as _scaled_mm takes it
            self.register_buffer("w_scale", scale.reshape(()))
            self.register_buffer("bias", lin.bias.detach().clone() if lin.bias is not None else None)
            self.static = x_amax is not None
            x_scale = torch.tensor(max(x_amax or 1.0, 1e-6) / top, dtype=torch.float32, device=w.device)
            self.register_buffer("x_scale", x_scale)
            self.register_buffer("x_inv", 1.0 / x_scale)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            x2 = x.reshape(-1, shape[-1])
            if self.static:
                x_scale = self.x_scale
                xq = (x2 * self.x_inv.to(x2.dtype)).clamp(-top, top).to(fp8)
            else:
                x_scale = x2.abs().amax().float().clamp(min=1e-12) / top
                xq = (x2 / x_scale).to(fp8)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            y = torch._scaled_mm(xq, self.w, x_scale, self.w_scale, bias=bias, out_dtype=x.dtype)
            return y.reshape(*shape[:-1], y.shape[-1])

    def ffn(layer: Any, x: torch.Tensor) -> torch.Tensor:
        return layer.ln2(x + layer.ffn_out(F.gelu(layer.ffn_in(x))))

    for name, child in list(module.named_modules()):
        for attr, sub in list(child.named_children()):
            if isinstance(sub, nn.Linear):
                key = f"{name}.{attr}".removeprefix(".").removeprefix("base.")
                if amax is not None and key not in amax:
                    raise KeyError(f"no calibrated amax for {key}")
                setattr(child, attr, Fp8Linear(sub, None if amax is None else amax[key]))
        if hasattr(child, "ffn_in"):
            child.ffn = types.MethodType(ffn, child)
    return module


def doc_sentences(root: Path, least: int = 40, most: int = 400) -> list[str]:
    """Sentences of the repository's prose (README and docs/*.md), in order: natural text for accuracy checks."""
    import re

    out: list[str] = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for para in path.read_text().split("\n\n"):
            for sent in re.split(r"(?<=[.!?])\s+", " ".join(para.split())):
                if least <= len(sent) <= most and not sent.startswith("|"):
                    out.append(sent)
    return out


def fp8_accuracy(checkpoint: Path, texts: list[str], batch: int = 64) -> dict[str, Any]:
    """Cosine of the checkpoint's fp8 embeddings (static and per-call scales), and fp16's, against fp32's, on the CPU.

    Scales are calibrated on the even-numbered texts and the cosine taken over the odd-numbered ones, with how
    often each of those finds the same nearest other text (a search's top hit) in fp8 as in fp32.
    """
    import torch
    from tokenizers import Tokenizer

    from inflight.hf_import import load_module, read_checkpoint

    ckpt = read_checkpoint(checkpoint)
    if ckpt.tokenizer is None:
        raise SystemExit(f"{checkpoint} has no tokenizer.json")
    tok = Tokenizer.from_file(str(ckpt.tokenizer))
    tok.enable_truncation(ckpt.max_seq_len)
    tok.enable_padding()

    def batches(ts: list[str]) -> list[list[Any]]:
        out = []
        for i in range(0, len(ts), batch):
            enc = tok.encode_batch(ts[i : i + batch])
            out.append([torch.tensor([e.ids for e in enc]), torch.tensor([e.attention_mask for e in enc])])
        return out

    def nearest(emb: Any) -> Any:  # each text's most similar other text (the embeddings are normalized)
        return (emb @ emb.T).fill_diagonal_(-2.0).argmax(1)

    calib, held = batches(texts[0::2]), batches(texts[1::2])
    ref = load_module(ckpt, kernels=False)
    amax = calibrate(ref, calib)
    doc: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "texts": {"calibration": len(texts[0::2]), "evaluated": len(texts[1::2])},
        "tokens_evaluated": int(sum(int(m.sum()) for _, m in held)),
        "activation_amax": amax,
    }
    with torch.inference_mode():
        want = torch.cat([ref(*args) for args in held])
        for name, scales in (("fp16", None), ("fp8", amax), ("fp8_dynamic", None)):
            if name == "fp16":  # the yardstick: the served precision, every op in fp16 on the CPU
                module = load_module(ckpt, kernels=False).half()
            else:
                module = _fp8(load_module(ckpt, kernels=False), scales)
            got = torch.cat([module(*args) for args in held]).float()
            cos = torch.nn.functional.cosine_similarity(got, want, dim=1)
            doc[name] = {
                "cosine_min": float(cos.min()),
                "cosine_mean": float(cos.mean()),
                "cosine_p01": float(cos.quantile(0.01)),
                "max_abs_error": float((got - want).abs().max()),
                "same_nearest_neighbour": float((nearest(got) == nearest(want)).float().mean()),
            }
            print(
                f"{name}: cosine against fp32 min {cos.min():.6f}, mean {cos.mean():.6f} over {len(cos)} texts; "
                f"the same nearest other text for {doc[name]['same_nearest_neighbour']:.1%} of them"
            )
    return doc


def _inputs(rng: np.random.Generator, vocab: int) -> dict[str, Any]:
    ids_u = rng.integers(1000, vocab, (ROWS, 64)).astype(np.int64)
    mask_u = np.ones_like(ids_u)
    lengths = rng.integers(16, 129, ROWS)
    ids_m = rng.integers(1000, vocab, (ROWS, 128)).astype(np.int64)
    mask_m = (np.arange(128)[None, :] < lengths[:, None]).astype(np.int64)
    ids_m *= mask_m
    return {"uniform": (ids_u, mask_u), "mixed": (ids_m, mask_m), "lengths": lengths}


def _graph_time(fn: Any, args: list[Any], iters: int = 30) -> tuple[float, Any]:
    """Seconds per replay of one call of ``fn(*args)`` captured in a CUDA graph, and its output."""
    import torch

    stream = torch.cuda.Stream()
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out = fn(*args)
        for _ in range(5):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iters):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters, out


def _kernels(fn: Any, args: list[Any], top: int = 15) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        fn(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn(*args)
            torch.cuda.synchronize()
    rows: dict[str, dict[str, Any]] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            r = rows.setdefault(ev.name, {"us": 0.0, "calls": 0.0})
            r["us"] += ev.device_time / 5
            r["calls"] += 1 / 5
    ordered: list[dict[str, Any]] = sorted(
        ({"kernel": k[:140], **v} for k, v in rows.items()), key=lambda r: -float(r["us"])
    )
    return [{"total_us": sum(r["us"] for r in ordered), "launches": sum(r["calls"] for r in ordered)}, *ordered[:top]]


def run_variant(variant: str, shape: Any, data: dict[str, Any], reference: Any) -> dict[str, Any]:
    """Time one variant on the three batches; its cosine against ``reference`` (fp32 outputs of the mixed batch)."""
    import torch

    from inflight.models.bert import make_module, make_unpadded_module
    from inflight.models.packing import unpad

    options, mode = _options(variant)
    common = {"shape": shape, "pooling": "mean", "normalize": True, **options}
    dev = torch.device("cuda")
    doc: dict[str, Any] = {"variant": variant, "options": {k: v for k, v in options.items()}, "compile": mode}
    t0 = time.perf_counter()
    module = make_module(0, **common).to(dev).half()
    amax: dict[str, float] | None = None
    if variant == "fp8":  # activation scales from the uniform batch (the cosine below is over the mixed one)
        ids, mask = data["uniform"]
        plain = make_module(0, **{**common, "kernels": False}).to(dev).half()
        amax = calibrate(plain, [[torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)]])
        doc["activation_amax"] = amax
        del plain
    if variant.startswith("fp8"):
        module = _fp8(module, amax)
    compiled = torch.compile(module, dynamic=True, mode=None if mode == "default" else mode)
    for name in ("uniform", "mixed"):
        ids, mask = data[name]
        args = [torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)]
        seconds, out = _graph_time(compiled, args)
        real = int(mask.sum())
        doc[name] = {"seconds": seconds, "real_tokens": real, "tokens_per_s": real / seconds}
        if name == "mixed":
            got = out[:256].float()
            doc["cosine_min_vs_fp32"] = float(torch.nn.functional.cosine_similarity(got, reference, dim=1).min())
            doc["max_abs_error_vs_fp32"] = float((got - reference).abs().max())
        else:
            doc["kernels_uniform"] = _kernels(compiled, args)
    doc["compile_s"] = time.perf_counter() - t0
    ids, mask = data["mixed"]
    u = unpad(list(ids), list(mask))
    un = make_unpadded_module(0, max_len=128, **common).to(dev).half()
    if variant.startswith("fp8"):
        un = _fp8(un, amax)
    try:
        compiled_un = torch.compile(un, dynamic=True, mode=None if mode == "default" else mode)
        args_un = [torch.from_numpy(a).to(dev) for a in u.arrays()]
        seconds, out_un = _graph_time(compiled_un, args_un)
        doc["unpadded"] = {"seconds": seconds, "real_tokens": u.tokens, "tokens_per_s": u.tokens / seconds}
        got = out_un[:256].float()
        doc["unpadded"]["cosine_min_vs_fp32"] = float(
            torch.nn.functional.cosine_similarity(got, reference, dim=1).min()
        )
        doc["kernels_unpadded"] = _kernels(compiled_un, args_un)
    except Exception as e:
        doc["unpadded"] = {"error": f"{type(e).__name__}: {e}"[:400]}
    return doc


def attention_grid(heads: int, head_dim: int, bandwidth: float) -> list[dict[str, Any]]:
    """The attention kernel's (heads per program, warps) grid at 2,048 x 64 and 2,048 x 128, and SDPA's time."""
    import torch

    from inflight.models import kernels as ops
    from inflight.models import triton_kernels as T

    rows = []
    for seq in (64, 128):
        qkv = torch.randn(ROWS, seq, 3 * heads * head_dim, device="cuda", dtype=torch.float16)
        keep = torch.ones(ROWS, seq, device="cuda", dtype=torch.bool)
        floor = (qkv.numel() + qkv.numel() // 3) * 2 / bandwidth
        sdpa, _ = _graph_time(lambda a, k: ops.attention_reference(a, k, heads), [qkv, keep])
        rows.append({"seq": seq, "kernel": "sdpa", "us": sdpa * 1e6, "floor_us": floor * 1e6})
        for group in [g for g in (1, 2, 3, 4, 6, 12) if heads % g == 0]:
            for warps in (1, 2, 4, 8):
                try:
                    t, _ = _graph_time(lambda a, k, c=(group, warps): T.triton_attention(a, k, heads, c), [qkv, keep])
                except Exception as e:
                    rows.append({"seq": seq, "group": group, "warps": warps, "error": str(e)[:200]})
                    continue
                rows.append({"seq": seq, "group": group, "warps": warps, "us": t * 1e6, "floor_us": floor * 1e6})
    return rows


def varlen_bench(heads: int, head_dim: int, lengths: np.ndarray) -> list[dict[str, Any]]:
    """The variable-length attention kernel against the padded one on the same sequences, by tiling."""
    import torch

    from inflight.models import triton_kernels as T

    rows = []
    h = heads * head_dim
    for name, lens in (("uniform 64", np.full(ROWS, 64)), ("mixed 16-128", lengths)):
        cu = torch.zeros(ROWS + 1, dtype=torch.int32, device="cuda")
        cu[1:] = torch.from_numpy(np.cumsum(lens)).cuda()
        qkv = torch.randn(int(lens.sum()) + 1, 3 * h, device="cuda", dtype=torch.float16)
        seq = int(lens.max())
        for tiles in ((128,), (32, 64, 128), (64, 128)):
            saved, T.VARLEN_TILES = T.VARLEN_TILES, tiles
            try:
                t, _ = _graph_time(lambda a, c, m=seq: T.triton_varlen_attention(a, c, m, heads), [qkv, cu])
            finally:
                T.VARLEN_TILES = saved
            rows.append({"batch": name, "kernel": "varlen", "tiles": list(tiles), "us": t * 1e6})
        padded = torch.randn(ROWS, seq, 3 * h, device="cuda", dtype=torch.float16)
        keep = torch.from_numpy(np.arange(seq)[None, :] < lens[:, None]).cuda()
        t, _ = _graph_time(lambda a, k: T.triton_attention(a, k, heads), [padded, keep])
        rows.append({"batch": name, "kernel": f"padded [{ROWS}, {seq}]", "us": t * 1e6})
    for r in rows:
        print("varlen bench:", r)
    return rows


def main() -> None:
    """Run the variants named (all by default) and write the JSON."""
    import torch

    from inflight.models.bert import BertShape, make_module

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--variant", action="append", choices=VARIANTS)
    p.add_argument("--attention", action="store_true", help="time the attention kernel's grid")
    p.add_argument("--varlen", action="store_true", help="time the variable-length attention's tilings")
    p.add_argument("--bandwidth", type=float, default=3.35e12, help="the card's memory bandwidth, bytes/s")
    p.add_argument("--fp8-accuracy", type=Path, metavar="CHECKPOINT", help="the fp8 cosine on the CPU, then stop")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if a.fp8_accuracy:
        texts = doc_sentences(Path(__file__).resolve().parents[2])
        acc = fp8_accuracy(a.fp8_accuracy, texts)
        acc = {
            "kind": "fp8_accuracy",
            "versions": {"torch": torch.__version__, "python": platform.python_version()},
            "cpu": platform.processor() or platform.machine(),
            **acc,
        }
        a.out.write_text(json.dumps(acc, indent=1) + "\n")
        return
    shape = BertShape(layers=a.layers, hidden=a.hidden, heads=a.heads, ffn=a.ffn)
    data = _inputs(np.random.default_rng(0), shape.vocab)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_module = make_module(0, shape=shape, pooling="mean", normalize=True, kernels=False).cuda().float()
    ids, mask = data["mixed"]
    with torch.inference_mode():
        reference = ref_module(torch.from_numpy(ids[:256]).cuda(), torch.from_numpy(mask[:256]).cuda()).float()
    del ref_module
    doc: dict[str, Any] = {
        "kind": "encoder_engine",
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "shape": {"layers": a.layers, "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn},
        "rows": ROWS,
        "variants": [],
    }
    if a.attention:
        doc["attention"] = attention_grid(a.heads, a.hidden // a.heads, a.bandwidth)
        timed = [r for r in doc["attention"] if "us" in r and "group" in r and r["seq"] == 64]
        best = min(timed, key=lambda r: r["us"])
        print("attention at 64:", best, "sdpa", [r for r in doc["attention"] if r.get("kernel") == "sdpa"])
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    if a.varlen:
        doc["varlen"] = varlen_bench(a.heads, a.hidden // a.heads, data["lengths"])
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for v in a.variant or DEFAULT_VARIANTS:
        try:
            with _patched(v):
                row = run_variant(v, shape, data, reference)
        except Exception as e:
            row = {"variant": v, "error": f"{type(e).__name__}: {e}"[:600]}
        doc["variants"].append(row)
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        if "error" in row:
            print(v, "failed:", row["error"])
            continue
        print(
            f"{v}: uniform {row['uniform']['tokens_per_s'] / 1e6:.2f}M tok/s "
            f"({row['uniform']['seconds'] * 1e3:.2f} ms), "
            f"mixed padded {row['mixed']['tokens_per_s'] / 1e6:.2f}M, unpadded "
            f"{row['unpadded'].get('tokens_per_s', 0) / 1e6:.2f}M, cos min {row['cosine_min_vs_fp32']:.6f}, "
            f"compile {row['compile_s']:.0f} s"
        )
        for key in ("kernels_uniform", "kernels_unpadded"):
            for k in row.get(key, [{}])[1:8]:
                print(f"   {key[8:]:9} {k['us']:8.1f} us x{k['calls']:.0f} {k['kernel'][:90]}")


if __name__ == "__main__":
    main()
