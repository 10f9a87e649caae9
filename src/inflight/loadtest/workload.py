"""What the load test sends: the workload, its inputs drawn once into a pool, the requests on the wire.

Everything per-request-expensive happens once here, before the test: inputs are drawn into a
small pool, each pool entry is turned into a KServe v2 binary-tensor HTTP body (with
``tritonclient.http.InferenceServerClient.generate_request_body``) and a gRPC
``ModelInferRequest``, and, with ``--check``, its reference output is computed by the same model
in PyTorch on the CPU. The Locust users then only pick the next entry, send it and check the
answer.

How the answers are checked is :mod:`inflight.loadtest.checks`.

Input distributions (token models):

* ``token_dist``: ``uniform`` ids in ``[1, vocab)``; ``zipf`` ids drawn from a Zipf law
  truncated to the vocabulary (rank 1 most frequent), closer to real text; ``text``: one English
  text per item sent as the model's text input (models whose config has one), of common words
  that are one token each in BERT's WordPiece vocabularies, so its token count is its words + 2.
* ``length_dist``: ``full`` every item uses all ``seq_len`` positions; ``uniform`` each item has a
  random length in ``[1, seq_len]``; ``real`` in ``[seq_len / 8, seq_len]`` (16-128 at 128: the
  lengths of sentences and short passages); the rest is padding (id 0, mask 0).

A model that is not built in (``inflight import-hf``, a user's config) is described by its config:
``Workload.config`` holds it, and the pool file carries it to every generator process.

Feature models (the heads) get standard normal features; the distributions do not apply.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from inflight.errors import ConfigError
from inflight.loadtest.references import reference_outputs
from inflight.models.registry import MODELS, get_model
from inflight.models.spec import WIRE_TYPES, ModelSpec

if TYPE_CHECKING:
    from inflight.variants import VariantConfig


LOGGER = logging.getLogger(__name__)

TokenDist = Literal["uniform", "zipf", "text"]

LengthDist = Literal["full", "uniform", "real"]

TOKEN_DISTS: tuple[str, ...] = ("uniform", "zipf", "text")

LENGTH_DISTS: tuple[str, ...] = ("full", "uniform", "real")

_WORDS_TEXT = (
    "the of and to in is was for that on with as by at from his it an were are which this be or has had "
    "not also first one their its new after but who they have her she two been other when there all "
    "during into school time may years more most only over city some world would where later up such used "
    "many can state about national out known university united then made between people while part since "
    "under three four five well work life game season team film music water light house long small large "
    "great high old early late south north east west"
)

#: Common English words, each one token in bert-base-uncased's vocabulary (all-MiniLM-L6-v2's too).
WORDS = tuple(_WORDS_TEXT.split())

#: Zipf exponent of the ``zipf`` token distribution (word frequencies follow s ~ 1).
ZIPF_EXPONENT = 1.1


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """How close a served output must be to the fp32 CPU reference.

    An element passes when ``|out - ref| <= atol_eff + rtol * |ref|``, where ``atol_eff`` is
    ``atol``, or ``atol * max|ref|`` of the request when ``scale_by_max`` is set (outputs whose
    magnitude is far from 1, such as the heads' logits).

    Attributes:
        rtol: Relative tolerance.
        atol: Absolute tolerance (or a fraction of the request's largest reference value).
        scale_by_max: Scale ``atol`` by the largest absolute reference value of the request.
    """

    rtol: float
    atol: float
    scale_by_max: bool = False


#: fp16 on the GPU against fp32 on the CPU: bert-tiny (2 layers, LayerNorm-ed, values ~1) within
#: 2e-2; the 20-layer heads accumulate more rounding and have logits far below 1.
TOLERANCES: dict[str, Tolerance] = {
    "bert_tiny": Tolerance(rtol=2e-2, atol=2e-2),
    "linear_head": Tolerance(rtol=5e-2, atol=5e-2, scale_by_max=True),
    "stacked_head": Tolerance(rtol=5e-2, atol=5e-2, scale_by_max=True),
    "seqlen_head": Tolerance(rtol=5e-2, atol=5e-2, scale_by_max=True),
}

DEFAULT_TOLERANCE = Tolerance(rtol=5e-2, atol=5e-2, scale_by_max=True)


def tolerance_for(model: str) -> Tolerance:
    """The tolerance of ``model`` (a base or variant name)."""
    from inflight.variants import base_name

    return TOLERANCES.get(base_name(model), DEFAULT_TOLERANCE)


_LOAD_FIELDS = ("items", "seq_len", "token_dist", "length_dist", "seed", "pool")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The request mix: one model, fixed items per request, a seeded pool of distinct inputs.

    Attributes:
        model: The served model name (``bert_tiny_sync``...).
        items: Items (batch rows) per request.
        seq_len: Sequence length (token models only).
        token_dist: ``uniform`` or ``zipf`` token ids.
        length_dist: ``full`` or ``uniform`` (random padding) lengths.
        seed: Seed of the pool; the same seed gives the same requests in every variant.
        pool: Distinct requests prepared per Locust process.
        config: The served model's config as JSON (``VariantConfig.to_json``), for a model that is not
            built in; empty: the built-in model of that name.
    """

    model: str
    items: int = 50
    seq_len: int = 64
    token_dist: TokenDist = "uniform"
    length_dist: LengthDist = "full"
    seed: int = 0
    pool: int = 16
    config: str = ""

    @classmethod
    def of(cls, model: str, load: Any) -> Workload:
        """The workload of ``model`` under ``load``.

        ``load`` is anything with the same attribute names: a ``LoadShape``, Locust's parsed
        options, argparse arguments.
        """
        return cls(model=model, **{f: getattr(load, f) for f in _LOAD_FIELDS})

    @property
    def spec(self) -> ModelSpec:
        """The model: what ``config`` says, else the built-in model of that name.

        Raises:
            ConfigError: for a model that is neither.
        """
        if self.config:
            return _spec_of_config(self.config)
        try:
            return get_model(self.model)
        except KeyError:
            raise ConfigError(
                f"unknown model {self.model!r}: it is not built in and the load test has no config of it; pass "
                "--repository with the repository holding its config.pbtxt (`inflight import-hf` writes one)"
            ) from None

    def check(self) -> None:
        """Reject a workload the model cannot serve.

        Raises:
            ConfigError: naming the option and the accepted range.
        """
        try:
            spec = self.spec
        except KeyError as e:
            raise ConfigError(f"--model {self.model!r}: {e.args[0]}") from None
        if not 1 <= self.items <= spec.max_batch_size:
            raise ConfigError(f"--items {self.items}: use 1..{spec.max_batch_size} (the model's max_batch_size)")
        if spec.variable_seq and not 1 <= self.seq_len <= (spec.max_seq_len or self.seq_len):
            raise ConfigError(f"--seq-len {self.seq_len}: use 1..{spec.max_seq_len} for {spec.name}")
        if self.token_dist not in TOKEN_DISTS:
            raise ConfigError(f"--token-dist {self.token_dist!r}: choose one of {list(TOKEN_DISTS)}")
        if self.length_dist not in LENGTH_DISTS:
            raise ConfigError(f"--length-dist {self.length_dist!r}: choose one of {list(LENGTH_DISTS)}")
        if self.pool < 1:
            raise ConfigError(f"--pool {self.pool}: prepare at least one request")
        if self.token_dist == "text" and spec.text_input is None:
            raise ConfigError(
                f"--token-dist text: {self.model} has no text input (its config has no TYPE_STRING input)"
            )

    def inputs(self, index: int) -> dict[str, np.ndarray]:
        """The inputs of pool entry ``index`` (deterministic in ``seed`` and ``index``)."""
        rng = np.random.default_rng([self.seed, index])
        return draw_inputs(
            self.spec,
            self.items,
            seq_len=self.seq_len,
            token_dist=self.token_dist,
            length_dist=self.length_dist,
            rng=rng,
        )

    def pool_inputs(self) -> list[dict[str, np.ndarray]]:
        """Every pool entry's inputs."""
        return [self.inputs(i) for i in range(self.pool)]


def draw_inputs(
    spec: ModelSpec,
    items: int,
    *,
    seq_len: int | None,
    token_dist: str = "uniform",
    length_dist: str = "full",
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Random valid inputs for ``items`` items (see the module docstring for the distributions)."""
    if spec.vocab_size is None:
        return spec.example_inputs(items, seq_len=seq_len, rng=rng)
    seq = seq_len if seq_len is not None else spec.default_seq_len
    assert seq is not None
    vocab = spec.vocab_size
    if length_dist in ("uniform", "real"):
        lengths = rng.integers(1 if length_dist == "uniform" else max(1, seq // 8), seq + 1, size=items)
    else:
        lengths = np.full(items, seq)
    if token_dist == "text":  # CLS and SEP are two of an item's tokens
        words = np.array(WORDS)
        texts = [" ".join(rng.choice(words, size=max(1, int(n) - 2))) for n in lengths]
        return {spec.text_input or "text": np.array([[t.encode()] for t in texts], dtype=np.bytes_)}
    if token_dist == "zipf":
        ranks = np.arange(1, vocab, dtype=np.float64)
        p = ranks**-ZIPF_EXPONENT
        p /= p.sum()
        ids = rng.choice(np.arange(1, vocab, dtype=np.int64), size=(items, seq), p=p)
    else:
        ids = rng.integers(1, vocab, size=(items, seq), dtype=np.int64)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    out = {spec.token_input or spec.seq_input or "input_ids": (ids * mask).astype(np.int64)}
    if spec.mask_input is not None:
        out[spec.mask_input] = mask
    return out


@dataclass(frozen=True)
class HttpRequest:
    """A prepared HTTP request: the binary body and its headers."""

    body: bytes
    headers: dict[str, str]


def http_request(spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> HttpRequest:
    """Build the KServe v2 binary-tensor body (inputs and outputs binary) and its headers."""
    import tritonclient.http as httpclient

    tensors = []
    for name, a in _wire_arrays(inputs):
        i = httpclient.InferInput(name, list(a.shape), _wire_type(a))
        i.set_data_from_numpy(a, binary_data=True)
        tensors.append(i)
    outputs = [httpclient.InferRequestedOutput(t.name, binary_data=True) for t in spec.outputs]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(tensors, outputs=outputs)
    # identity: FastHttpUser would otherwise ask for gzip, and Triton would compress every response
    headers = {"Content-Type": "application/octet-stream", "Accept-Encoding": "identity"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return HttpRequest(body=bytes(body), headers=headers)


def grpc_request(spec: ModelSpec, model_name: str, inputs: Mapping[str, np.ndarray]) -> Any:
    """Build a ``ModelInferRequest`` with raw input contents, ready to send as is."""
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    req = service_pb2.ModelInferRequest(model_name=model_name)
    for name, a in _wire_arrays(inputs):
        req.inputs.add(name=name, datatype=_wire_type(a), shape=list(a.shape))
        raw = serialize_byte_tensor(a) if a.dtype == np.object_ else a  # texts: each length-prefixed
        req.raw_input_contents.append(raw.item() if raw.dtype == np.object_ else raw.tobytes())
    for t in spec.outputs:
        req.outputs.add(name=t.name)
    return req


def model_config(repository: Path | None, model: str) -> str:
    """``Workload.config`` for ``model``: its config.pbtxt in ``repository`` as JSON, or empty for a built-in model.

    Raises:
        ConfigError: when a model that is not built in has no config there.
    """
    from inflight.variants import base_name, parse_pbtxt, variant_from_proto

    if base_name(model) in MODELS:
        return ""
    path = Path(repository or "model_repository") / model / "config.pbtxt"
    if not path.is_file():
        raise ConfigError(f"{model} is not built in and {path} does not exist: pass --repository with its repository")
    return variant_config(variant_from_proto(parse_pbtxt(path.read_text())))


def variant_config(vc: VariantConfig) -> str:
    """``Workload.config`` for a variant the load test loads: its config as JSON, or empty for a built-in model."""
    return "" if vc.model in MODELS else vc.to_json()


def _wire_arrays(inputs: Mapping[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """The request's arrays as sent: contiguous, texts (stored as fixed-width bytes) as objects."""
    return [(k, v.astype(np.object_) if v.dtype.kind == "S" else np.ascontiguousarray(v)) for k, v in inputs.items()]


def _wire_type(a: np.ndarray) -> str:
    """The KServe v2 datatype of ``a`` (``BYTES`` for texts)."""
    return "BYTES" if a.dtype == np.object_ else WIRE_TYPES[a.dtype.name]


@functools.lru_cache(maxsize=16)
def _spec_of_config(config: str) -> ModelSpec:
    """The model a config (JSON) describes, named by its base model."""
    from inflight.model_config import proto_from_json
    from inflight.variants import spec_of

    return spec_of(proto_from_json(config))


@dataclass(frozen=True, kw_only=True)
class Pool:
    """The prepared inputs of a workload and, for ``--check``, their reference outputs.

    Attributes:
        workload: What the pool was drawn for.
        inputs: One input set per pool entry.
        references: One output set per entry (fp32, PyTorch on the CPU), or None.
    """

    workload: Workload
    inputs: list[dict[str, np.ndarray]]
    references: list[dict[str, np.ndarray]] | None = None


def build_pool(workload: Workload, *, repository: Path | None = None, check: bool = False) -> Pool:
    """Draw the pool's inputs and, with ``check``, compute the references from ``repository``.

    Raises:
        ConfigError: for an invalid workload, or ``check`` without a usable repository.
    """
    workload.check()
    inputs = workload.pool_inputs()
    references = None
    if check:
        if repository is None:
            raise ConfigError("--check needs --repository, the model repository holding the Torch artifact")
        if workload.token_dist == "text":
            raise ConfigError("--check compares token-id requests with the artifact's outputs; use token ids with it")
        references = reference_outputs(repository, workload.model, inputs, workload.spec)
    return Pool(workload=workload, inputs=inputs, references=references)


def save_pool(pool: Pool, path: Path) -> Path:
    """Write ``pool`` as one ``.npz`` file (the runner prepares it once for every Locust process)."""
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(dataclasses.asdict(pool.workload)))}
    for i, x in enumerate(pool.inputs):
        arrays.update({f"in{i}/{k}": v for k, v in x.items()})
    for i, y in enumerate(pool.references or ()):
        arrays.update({f"ref{i}/{k}": v for k, v in y.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez(f, **arrays)
    return path


def load_pool(path: Path) -> Pool:
    """Read a pool written by ``save_pool``.

    Raises:
        ConfigError: when the file is missing or not a pool file.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise ConfigError(f"--pool-file {path}: cannot read it ({e}); let `inflight ab` write one") from None
    if "meta" not in data:
        raise ConfigError(f"--pool-file {path} is not a request pool (no meta entry)")
    workload = Workload(**json.loads(str(data["meta"])))
    inputs: list[dict[str, np.ndarray]] = [{} for _ in range(workload.pool)]
    refs: list[dict[str, np.ndarray]] = [{} for _ in range(workload.pool)]
    for key, value in data.items():
        kind, _, name = key.partition("/")
        if kind.startswith("in"):
            inputs[int(kind[2:])][name] = value
        elif kind.startswith("ref"):
            refs[int(kind[3:])][name] = value
    return Pool(workload=workload, inputs=inputs, references=refs if all(refs) else None)


def pool_command(workload: Workload, *, out: Path, repository: Path | None, check: bool) -> list[str]:
    """The command line that writes ``workload``'s pool to ``out`` in a separate Python process."""
    import sys

    cmd = [
        sys.executable,
        "-m",
        "inflight.loadtest.workload",
        "--model",
        workload.model,
        "--items",
        str(workload.items),
        "--seq-len",
        str(workload.seq_len),
        "--token-dist",
        workload.token_dist,
        "--length-dist",
        workload.length_dist,
        "--seed",
        str(workload.seed),
        "--pool",
        str(workload.pool),
        "--out",
        str(out),
    ]
    if check:
        cmd.append("--check")
    if repository is not None:
        cmd += ["--repository", str(repository)]
    return cmd


def main(argv: Sequence[str] | None = None) -> int:
    """Write a request pool file: ``python -m inflight.loadtest.workload --model M --out pool.npz [--check]``.

    Locust processes load it with ``--pool-file`` instead of importing torch themselves.
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m inflight.loadtest.workload", description=main.__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--items", type=int, default=50)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--token-dist", choices=TOKEN_DISTS, default="uniform")
    p.add_argument("--length-dist", choices=LENGTH_DISTS, default="full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=16)
    p.add_argument("--check", action="store_true", help="Also compute the reference outputs (PyTorch, CPU).")
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        w = dataclasses.replace(Workload.of(a.model, a), config=model_config(a.repository, a.model))
    except ConfigError as e:
        LOGGER.error("%s", e)
        return 2
    try:
        save_pool(build_pool(w, repository=a.repository, check=a.check), a.out)
    except ConfigError as e:
        LOGGER.error("%s", e)
        return 2
    LOGGER.info("wrote %s", a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
