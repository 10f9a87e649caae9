#!/usr/bin/env python3
"""Build ``model.plan`` from a model's ONNX file with TensorRT (``tensorrt`` or ``tensorrt_rtx``).

    python scripts/build_engine.py --model bert_tiny [--repository model_repository] [--profiles 4]

Reads ``<repo>/<model>_trt/1/model.onnx`` (written by ``inflight build-models``), builds a plan with
``--profiles`` identical optimization profiles over the batch range [1, max_batch] (and the
sequence range [1, max_seq] for bert_tiny) — our backend gives each in-flight slot its own
execution context on its own profile — and writes ``model.plan`` into ``<model>_trt/1/`` (for the
stock TensorRT backend) and hard-links it into ``<model>_inflight/1/`` and ``<model>_sync/1/``
(for ``engine=tensorrt``). Run it on the GPU that will serve the plan: plans are specific to a GPU
architecture and TensorRT version.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inflight.models.registry import get_model
from inflight.runtime.engines.tensorrt_engine import import_tensorrt

if TYPE_CHECKING:
    import tensorrt as trt

LOGGER = logging.getLogger("build_engine")


def build_plan(
    onnx: Path, *, model: str, profiles: int, max_batch: int, opt_batch: int, max_seq: int, opt_seq: int, fp16: bool
) -> bytes:
    """Parse ``onnx`` and build a serialized plan.

    Raises:
        SystemExit: when TensorRT is missing or the build fails, with the parser's/builder's errors.
    """
    mod: Any = import_tensorrt()
    if mod is None:
        raise SystemExit(
            "TensorRT is not importable (neither `tensorrt` nor `tensorrt_rtx`); run this inside an NGC Triton or "
            "TensorRT container, or install TensorRT-RTX (`pip install tensorrt-rtx-cu13`) on a GPU it supports"
        )
    spec = get_model(model)
    logger: trt.ILogger = mod.Logger(mod.Logger.WARNING)
    builder: trt.Builder = mod.Builder(logger)
    network: trt.INetworkDefinition = builder.create_network(0)
    parser: trt.OnnxParser = mod.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise SystemExit(f"TensorRT could not parse {onnx}: {errors}")
    config: trt.IBuilderConfig = builder.create_builder_config()
    if fp16 and hasattr(mod.BuilderFlag, "FP16"):
        config.set_flag(mod.BuilderFlag.FP16)
    for _ in range(profiles):
        profile: trt.IOptimizationProfile = builder.create_optimization_profile()
        for t in spec.inputs:
            lo, opt, hi = (mod.Dims(t.shape(b, s)) for b, s in ((1, 1), (opt_batch, opt_seq), (max_batch, max_seq)))
            profile.set_shape(t.name, lo, opt, hi)
        config.add_optimization_profile(profile)
    t0 = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SystemExit(f"TensorRT failed to build a plan from {onnx}; see the messages above")
    LOGGER.info("built %s plan (%d profiles) in %.1f s", model, profiles, time.perf_counter() - t0)
    return bytes(memoryview(plan))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--repository", type=Path, default=Path("model_repository"))
    ap.add_argument("--profiles", type=int, default=4, help="optimization profiles = slots per instance")
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--opt-batch", type=int, default=None)
    ap.add_argument("--max-seq", type=int, default=None)
    ap.add_argument("--opt-seq", type=int, default=None)
    ap.add_argument("--fp32", action="store_true", help="no FP16 kernels")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = get_model(args.model)
    onnx = args.repository / f"{spec.name}_trt" / "1" / "model.onnx"
    if not onnx.is_file():
        raise SystemExit(f"{onnx} not found; run `inflight build-models {spec.name}` first")
    max_batch = args.max_batch or spec.max_batch_size
    max_seq = args.max_seq or (spec.max_seq_len or 1)
    plan = build_plan(
        onnx,
        model=spec.name,
        profiles=args.profiles,
        max_batch=max_batch,
        opt_batch=args.opt_batch or max_batch,
        max_seq=max_seq,
        opt_seq=args.opt_seq or (spec.default_seq_len or 1),
        fp16=not args.fp32,
    )
    target = args.repository / f"{spec.name}_trt" / "1" / "model.plan"
    target.write_bytes(plan)
    for variant in ("inflight", "sync"):
        link = args.repository / f"{spec.name}_{variant}" / "1" / "model.plan"
        if link.exists():
            link.unlink()
        try:
            os.link(target, link)
        except OSError:
            link.write_bytes(plan)
    print(f"wrote {target} ({len(plan) / 2**20:.1f} MiB) and linked it into {spec.name}_inflight/_sync")
    return 0


if __name__ == "__main__":
    sys.exit(main())
