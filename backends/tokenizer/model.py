"""Triton entry point of the ``tokenizer`` Python-based backend: text in, token ids out, on CPU instances of its own.

The first step of ``<model>_text``, an ensemble whose second step is the encoder (``<model>_inflight``):
Triton runs this model's instances in stubs of their own, so tokenizing happens on the server's CPU
cores beside the encoder, never on the encoder's execute thread (as text-embeddings-inference
tokenizes in worker threads ahead of its batcher). Each ``execute()`` tokenizes every text of its
batch with one ``encode_batch`` of the checkpoint's own ``tokenizer.json``
(``inflight.runtime.text.TextEncoder``: truncation to ``max_seq_len``, each request padded only to its
own longest text) and answers each request with its token ids and attention mask; a bad text (not
UTF-8, empty, over ``max_text_bytes``) fails its request alone.

The config names the text input (TYPE_STRING ``[1]``) and the two INT64 ``[-1]`` outputs, token ids
first; parameters ``tokenizer`` (relative to the version folder), ``max_seq_len`` and
``max_text_bytes`` (``inflight.model_config.ModelParameters``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import triton_python_backend_utils as pb_utils

try:
    from tritonclient.grpc import model_config_pb2 as mc

    from inflight.errors import InflightError, ValidationError
    from inflight.model_config import ModelParameters, parameters_of, proto_from_json
    from inflight.model_spec import TEXT_TYPE
    from inflight.runtime.text import TextEncoder
except ImportError as e:  # the stub's Python cannot see the package
    raise pb_utils.TritonModelException(
        f"the tokenizer backend needs the inflight package and tokenizers ({e}); install them into the Python "
        "environment the Triton stub uses, or start the server with `inflight serve`"
    ) from None


class TritonPythonModel:
    """One instance of ``<model>_tokenizer``."""

    def initialize(self, args: dict[str, str]) -> None:
        """Load the tokenizer named by the config's parameters."""
        cfg = proto_from_json(args["model_config"])
        self.name = cfg.name or args.get("model_name", "?")
        texts = [t.name for t in cfg.input if mc.DataType.Name(t.data_type) == TEXT_TYPE]
        outputs = [t.name for t in cfg.output]
        if len(texts) != 1 or len(outputs) != 2:
            raise pb_utils.TritonModelException(
                f"{self.name}: the tokenizer takes one TYPE_STRING input and gives two outputs (token ids, then the "
                f"attention mask); the config has inputs {[t.name for t in cfg.input]} and outputs {outputs}"
            )
        self.text, (self.ids, self.mask) = texts[0], outputs
        version_dir = Path(args["model_repository"]) / str(args.get("model_version", "1"))
        try:
            mp = ModelParameters.from_parameters(parameters_of(cfg))
            self.encoder = TextEncoder(
                version_dir / (mp.tokenizer or "tokenizer.json"),
                max_len=mp.max_seq_len or 512,
                max_bytes=mp.max_text_bytes,
                word_cache=mp.tokenizer_word_cache,
            )
        except InflightError as e:
            raise pb_utils.TritonModelException(f"{self.name}: {e}") from None
        self.instance = args.get("model_instance_name", "?")
        self.stats = {"batches": 0, "requests": 0, "texts": 0, "rejected": 0, "tokenize_s": 0.0}
        pb_utils.Logger.log_info(f"[tokenizer] {self.name} ({self.instance}): {self.encoder.describe()}")

    def execute(self, requests: list[Any]) -> list[Any]:
        """Tokenize the batch's texts at once; one response per request (its ids and mask, or its error)."""
        t0 = time.perf_counter()
        arrays: list[Any] = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, self.text)
            arrays.append(tensor.as_numpy() if tensor is not None else None)
        given = [a for a in arrays if a is not None]
        encoded = iter(self.encoder.encode_batch(given))
        responses = []
        for a in arrays:
            result: Any = next(encoded) if a is not None else ValidationError(f"input {self.text!r} is missing")
            if isinstance(result, ValidationError):
                self.stats["rejected"] += 1
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(result))))
                continue
            ids, mask = result
            self.stats["texts"] += len(ids)
            tensors = [pb_utils.Tensor(self.ids, ids), pb_utils.Tensor(self.mask, mask)]  # int64 both
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        self.stats["batches"] += 1
        self.stats["requests"] += len(requests)
        self.stats["tokenize_s"] += time.perf_counter() - t0
        return responses

    def finalize(self) -> None:
        """Log the instance's counts."""
        record = {
            **self.stats,
            "tokenize_s": round(float(self.stats["tokenize_s"]), 3),
            "library_texts": self.encoder.library_texts,
            "pid": os.getpid(),
        }
        pb_utils.Logger.log_info(f"[tokenizer] {self.name} ({self.instance}) finalized: {json.dumps(record)}")
