"""Mixed-length batches through the packed and the unpadded models: measured, not served.

:func:`packed_mixed_row` packs a batch's sequences into rows (``make_packed_module``),
:func:`unpadded_row` lays them end to end without their masked tokens
(``make_unpadded_module``); each compiles its module, captures one call in a CUDA graph, times
its replays and checks the outputs against the fp32 CPU model.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from inflight.runtime.batch import Batch

#: Sequences one packed row may hold (query slots per row of the packed model).
PACKED_PER_ROW = 16


def _graph_time(
    module: Any, arrays: tuple[np.ndarray, ...], precision: str, device_id: int, iters: int, warmup: int
) -> tuple[float, float, Any]:
    """Compile ``module`` in ``precision``, capture one call in a CUDA graph and time its replays.

    The module is compiled with inductor (dynamic shapes) and called on ``arrays`` copied to the
    GPU. Returns (seconds per replay, compile and capture seconds, the captured output tensor).
    """
    import torch

    dev = torch.device(f"cuda:{device_id}")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    compiled = torch.compile(module.to(dev).to(dtype), dynamic=True)
    static = [torch.from_numpy(a).to(dev) for a in arrays]
    stream = torch.cuda.Stream(dev)
    t1 = time.perf_counter()
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):
            compiled(*static)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph, stream=stream):
        out = compiled(*static)
    compile_s = time.perf_counter() - t1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            graph.replay()
        start.record(stream)
        for _ in range(iters):
            graph.replay()
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters, compile_s, out


def _max_error_per_sequence(got: np.ndarray, ids: list[np.ndarray], masks: list[np.ndarray], reference: Any) -> float:
    """Largest ``|got[i] - reference(sequence i alone)|`` over the first 64 sequences."""
    import torch

    err = 0.0
    with torch.inference_mode():
        for i in range(min(64, len(ids))):
            want = reference(torch.from_numpy(ids[i][None]), torch.from_numpy(masks[i][None])).numpy()[0]
            err = max(err, float(np.abs(got[i] - want).max()))
    return err


def unpadded_row(
    batch: Batch, precision: str, device_id: int, reference: Any, iters: int, warmup: int
) -> dict[str, Any]:
    """A batch through the unpadded model (``make_unpadded_module``), replayed from a graph.

    Every sequence's masked tokens are left out and the rest laid end to end
    (:func:`inflight.models.packing.unpad`), attention is FlashAttention's variable-length kernel.
    Compiled from the module as :func:`packed_mixed_row` does. Returns the time per batch, the
    tokens of the requests (sequence lengths, masked tokens included: what the served rows count
    as real tokens, so ``tokens_per_s`` compares with theirs) and the tokens computed (the unmasked
    ones), the host time to unpad, and the largest error against the fp32 CPU model over the first
    64 sequences.
    """
    from inflight.models.bert import make_unpadded_module
    from inflight.models.packing import unpad

    ids = [it.inputs["input_ids"][j] for it in batch.items for j in range(it.count)]
    masks = [it.inputs["attention_mask"][j] for it in batch.items for j in range(it.count)]
    t0 = time.perf_counter()
    u = unpad(ids, masks)
    unpad_s = time.perf_counter() - t0
    max_len = max(len(x) for x in ids)
    module = make_unpadded_module(0, max_len=max_len)
    seconds, compile_s, out = _graph_time(module, u.arrays(), precision, device_id, iters, warmup)
    got = out.float().cpu().numpy()
    err = _max_error_per_sequence(got, ids, masks, reference)
    return {
        "seconds_per_batch": seconds,
        "real_tokens": u.padded_tokens,
        "computed_tokens": u.tokens,
        "tokens_per_s": u.padded_tokens / seconds,
        "sequences": len(ids),
        "max_len": max_len,
        "unpad_s": unpad_s,
        "compile_and_capture_s": compile_s,
        "max_abs_error_vs_fp32_cpu": err,
    }


def packed_mixed_row(
    batch: Batch, row_len: int, precision: str, device_id: int, reference: Any, iters: int, warmup: int
) -> dict[str, Any]:
    """The mixed-length batch packed into rows of ``row_len`` (``make_packed_module``), replayed from a graph.

    The packed module is compiled from the module (inductor, dynamic shapes) rather than from the
    repository's artifact, cast to ``precision`` as the served engine casts its module, and its
    step captured in one CUDA graph on static inputs. Returns the time per batch, real and
    computed tokens, rows, the host time to pack, and the largest error against the fp32 CPU model
    over the first 64 sequences.
    """
    from inflight.models.bert import make_packed_module
    from inflight.models.packing import pack

    ids = [it.inputs["input_ids"][j] for it in batch.items for j in range(it.count)]
    masks = [it.inputs["attention_mask"][j] for it in batch.items for j in range(it.count)]
    t0 = time.perf_counter()
    packed = pack(ids, masks, row_len, PACKED_PER_ROW)
    pack_s = time.perf_counter() - t0
    module = make_packed_module(0)
    seconds, compile_s, out = _graph_time(module, packed.arrays(), precision, device_id, iters, warmup)
    got = packed.unpack(out.float().cpu().numpy())
    err = _max_error_per_sequence(got, ids, masks, reference)
    return {
        "seconds_per_batch": seconds,
        "real_tokens": packed.real_tokens,
        "padded_tokens": packed.padded_tokens,
        "tokens_per_s": packed.real_tokens / seconds,
        "rows": packed.rows,
        "row_len": row_len,
        "per_row": PACKED_PER_ROW,
        "padding_waste": packed.padded_tokens / packed.real_tokens - 1,
        "pack_s": pack_s,
        "compile_and_capture_s": compile_s,
        "max_abs_error_vs_fp32_cpu": err,
    }
