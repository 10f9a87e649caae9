"""Triton entry point of the ``plain`` Python-based backend: the usual Python-backend deployment.

The baseline every report puts beside ours (issue 30, item 6): the model served the way the
Python backend's examples serve a PyTorch model (``triton-inference-server/python_backend``,
``examples/pytorch``), with the habits a careful user adds, and nothing of the inflight runtime:

* ``initialize()`` builds the Torch module once, moves it to the instance's GPU in fp16 (fp32 on
  a CPU instance) and puts it in eval mode;
* ``execute()`` reads every request's inputs, checks them (a bad request gets its own error
  response), stacks the batch's requests into one tensor per input (padding shorter sequences,
  their mask 0), runs the module eagerly under ``torch.inference_mode()`` and returns the
  responses. One batch at a time: the copy back to the host waits for the GPU, as in the examples.
  No CUDA graphs, no compiler, no pinned buffers, no copy streams.

The model is what its config and its version folder say, as for every Triton backend: the
tensors and value checks from config.pbtxt (``inflight.model_spec``), the module from the
folder's ``model.pt2`` (a ``torch.export`` program run eagerly; ``inflight build-models`` and
``inflight import-hf`` write it with plain PyTorch operators and the whole last layer, the same
function ``<model>_inflight`` and ``<model>_sync`` compute, so their outputs agree within fp16
tolerance), and a text input tokenized with the folder's ``tokenizer.json`` as the inflight
backend does (``inflight.runtime.text``). A Python-based backend runs in the same stub as
``backend: "python"`` with ``model.py`` in the version folder; keeping the file here lets the
tools write ``<model>_plain`` as a config and an artifact.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

try:
    import torch

    from inflight.errors import InflightError, ValidationError
    from inflight.model_config import ModelParameters, parameters_of, proto_from_json
    from inflight.model_spec import spec_from_config
    from inflight.models.artifact import load_module
except ImportError as e:  # the stub's Python cannot see torch or the package
    raise pb_utils.TritonModelException(
        f"the plain backend needs torch and the inflight package ({e}); install both into the Python environment "
        "the Triton stub uses, or start the server with `inflight serve`"
    ) from None


class TritonPythonModel:
    """One instance of ``<model>_plain``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Build the module on the instance's device (fp16 on a GPU, fp32 on a CPU)."""
        cfg = proto_from_json(args["model_config"])
        self.name = cfg.name or args.get("model_name", "?")
        version_dir = Path(args["model_repository"]) / str(args.get("model_version", "1"))
        gpu = args.get("model_instance_kind") == "GPU" and torch.cuda.is_available()
        self.device = torch.device("cuda", int(args.get("model_instance_device_id", 0))) if gpu else torch.device("cpu")
        self.dtype = torch.float16 if gpu else torch.float32
        self.text: Any = None
        try:
            self.spec = spec_from_config(cfg, version_dir=version_dir)
            if self.spec.text_input is not None:
                from inflight.runtime.text import TextEncoder

                mp = ModelParameters.from_parameters(parameters_of(cfg))
                self.text = TextEncoder(  # the library alone, as users' own Python models call it
                    version_dir / mp.tokenizer,
                    max_len=self.spec.max_seq_len or 512,
                    max_bytes=mp.max_text_bytes,
                    word_cache=0,
                )
            module = load_module(version_dir / "model.pt2", spec=self.spec)
        except InflightError as e:
            raise pb_utils.TritonModelException(f"{self.name}: {e}") from None
        self.module: Any = module.to(self.device)
        if gpu:
            self.module = self.module.to(self.dtype)
        self.outputs = [(t.name, np.dtype(t.dtype)) for t in self.spec.outputs]
        self.variable = {t.name for t in self.spec.inputs if t.variable}
        self.instance = args.get("model_instance_name", "?")
        self.stats = {"batches": 0, "requests": 0, "items": 0, "responses": 0, "rejected": 0, "errors": 0}
        pb_utils.Logger.log_info(f"[plain] {self.name} ({self.instance}): eager Torch on {self.device}, {self.dtype}")

    def execute(self, requests: list[Any]) -> list[Any]:
        """Answer the batch in-band: one eager forward over every valid request."""
        responses: list[Any] = [None] * len(requests)
        valid: list[tuple[int, dict[str, np.ndarray], int]] = []
        for i, request in enumerate(requests):
            try:
                arrays = self._read(request)
                valid.append((i, arrays, self.spec.validate(arrays)))
            except (ValidationError, AttributeError) as e:
                message = str(e) if isinstance(e, ValidationError) else f"{self.name}: an input is missing ({e})"
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
                self.stats["rejected"] += 1
        if valid:
            try:
                outs = self._forward([arrays for _, arrays, _ in valid])
                names = [name for name, _ in self.outputs]
                at = 0
                for i, _, n in valid:
                    tensors = [pb_utils.Tensor(name, out[at : at + n]) for name, out in zip(names, outs, strict=True)]
                    responses[i] = pb_utils.InferenceResponse(output_tensors=tensors)
                    at += n
                self.stats["batches"] += 1
                self.stats["items"] += at
                self.stats["responses"] += len(valid)
            except Exception as e:  # the batch fails, the server carries on
                pb_utils.Logger.log_error(f"[plain] {self.name}: the batch failed\n{traceback.format_exc()}")
                self.stats["errors"] += len(valid)
                for i, _, _ in valid:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"{self.name}: inference failed ({type(e).__name__}: {e})")
                    )
        self.stats["requests"] += len(requests)
        return responses

    def _read(self, request: Any) -> dict[str, np.ndarray]:
        """The request's arrays; a text request's texts tokenized (one request at a time, as users write it)."""
        if self.text is not None:
            tensor = pb_utils.get_input_tensor_by_name(request, self.spec.text_input)
            if tensor is not None:
                sent = [t.name for t in self.spec.inputs if pb_utils.get_input_tensor_by_name(request, t.name)]
                if sent:
                    raise ValidationError(
                        f"this request sends both {self.spec.text_input!r} and {sent}; send the text or the token "
                        "inputs, not both",
                        "text_and_tokens",
                    )
                (result,) = self.text.encode_batch([tensor.as_numpy()])
                if isinstance(result, ValidationError):
                    raise result
                ids, mask = result
                return {self.spec.token_input or "input_ids": ids, self.spec.mask_input or "attention_mask": mask}
        arrays = {}
        for t in self.spec.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, t.name)
            if tensor is None:
                raise ValidationError(f"{self.name}: input {t.name!r} is missing", "missing_input")
            arrays[t.name] = tensor.as_numpy()
        return arrays

    def _forward(self, batch: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        """Stack the requests' arrays (padding variable dimensions with 0) and run the module."""
        tensors = []
        for t in self.spec.inputs:
            parts = [arrays[t.name] for arrays in batch]
            if t.name in self.variable and len({p.shape[1] for p in parts}) > 1:
                width = max(p.shape[1] for p in parts)
                parts = [np.pad(p, ((0, 0), (0, width - p.shape[1]))) for p in parts]
            x = torch.from_numpy(np.concatenate(parts)).to(self.device)
            tensors.append(x.to(self.dtype) if x.is_floating_point() else x)
        if self.module is None:
            raise RuntimeError("the model was finalized")
        with torch.inference_mode():
            out = self.module(*tensors)
        outs = out if isinstance(out, tuple) else (out,)
        dtypes = [dtype for _, dtype in self.outputs]
        return [o.float().cpu().numpy().astype(d, copy=False) for o, d in zip(outs, dtypes, strict=True)]

    def finalize(self) -> None:
        """Log the instance's counts in inflight's ``finalized`` format and release the module."""
        record = {**self.stats, "pid": os.getpid()}
        pb_utils.Logger.log_info(f"[plain] {self.name} ({self.instance}) finalized (drained): {json.dumps(record)}")
        self.module = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
