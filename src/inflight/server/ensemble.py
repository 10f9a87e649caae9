"""A variant served through an ensemble: ``NAME_text`` (tokenizer instances, then the encoder) as users deploy text.

``inflight ab minilm_text@instances=8,tokenizer_instances=4`` measures the ensemble a user sends text to, and
``inflight serve -m minilm_text@...`` serves it so (:func:`load_plan`).
The spec's keys go to the ensemble's encoder step (the model the runner knows how to override:
``instances``, ``delay_us``, ``slots``...), except ``tokenizer_instances``, the count of every other step's
instances (the CPU tokenizer), and ``encoder``, another model of the repository in the encoder step's place:
``minilm_text@encoder=minilm_null`` is the text path's own bound (tokenizer, the ensemble's hop and Triton's
request path, the GPU left out), as ``minilm_null`` is the token ids' one; the stand-in runs the encoder's instance
count unless the spec's ``instances`` says otherwise. The runner loads the steps in order
(encoder, tokenizer, then the ensemble, each with its configuration as the load's override, as
``tests/integration/test_text_pipeline.py`` does) and unloads them in reverse, so nothing the repository says
about instance counts is rewritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from inflight.errors import ConfigError
from inflight.server import control
from inflight.variants import VariantConfig, parse_pbtxt, parse_variant_arg

#: The spec key that sets the instance count of the ensemble's steps other than the encoder.
TOKENIZER_INSTANCES = "tokenizer_instances"

#: The spec key that puts another model of the repository (one taking the same inputs) in the encoder step's place.
ENCODER = "encoder"


@dataclass(frozen=True, kw_only=True)
class Ensemble:
    """What the runner loads besides the encoder: the other steps, then the ensemble itself.

    Attributes:
        name: The ensemble's name (the model the load is sent to).
        config_json: The ensemble's configuration (Triton's JSON form).
        steps: ``(name, configuration JSON)`` of each step other than the encoder, in the ensemble's order.
    """

    name: str
    config_json: str
    steps: tuple[tuple[str, str], ...]

    def after_encoder(self) -> list[tuple[str, str]]:
        """The models to load after the encoder, the ensemble last."""
        return [*self.steps, (self.name, self.config_json)]

    def step_models(self) -> list[str]:
        """The models of the ensemble's steps in its order, the encoder among them (the one a spec's keys went to)."""
        return [str(s["model_name"]) for s in json.loads(self.config_json)["ensemble_scheduling"]["step"]]


def read_config(repository: Path, name: str) -> mc.ModelConfig | None:
    """``<repository>/<name>/config.pbtxt`` parsed, or None when there is none."""
    path = Path(repository) / name / "config.pbtxt"
    return parse_pbtxt(path.read_text()) if path.is_file() else None


def resolve(repository: Path, name: str, overrides: dict[str, str]) -> tuple[VariantConfig, Ensemble]:
    """The ensemble ``name``'s encoder (``overrides`` applied) and what else to load for it (:func:`resolve_spec`).

    Raises:
        ConfigError: when ``name`` is not an ensemble, or as :func:`resolve_spec`.
    """
    encoder, ensemble = resolve_spec(repository, name, overrides)
    if ensemble is None:
        raise ConfigError(
            f"{name} is not an ensemble in {repository}; name a model whose config says platform: ensemble"
        )
    return encoder, ensemble


def resolve_spec(repository: Path, name: str, overrides: dict[str, str]) -> tuple[VariantConfig, Ensemble | None]:
    """The model ``name`` with ``overrides``: a variant alone, or an ensemble's encoder and what else to load for it.

    Its config.pbtxt tells which (the one place that decides, for ``inflight ab`` and ``inflight serve``). An
    ensemble's encoder is the one step whose model is not a tokenizer (``backend: "tokenizer"``); ``overrides``
    other than ``tokenizer_instances`` apply to it (``inflight.variants.apply_overrides``).

    Raises:
        ConfigError: for a bad key; for an ensemble, also when a step is missing from the repository, it has no
            encoder step or more than one, ``tokenizer_instances`` is not a positive integer, or ``encoder`` names
            no model of the repository, or an ensemble or a tokenizer; ``encoder`` on a model that is no ensemble.
        ServerError: when a variant's config.pbtxt is missing.
    """
    cfg = read_config(repository, name)
    if cfg is None or cfg.platform != "ensemble":
        if ENCODER in overrides:
            raise ConfigError(f"{name}: {ENCODER}= replaces an ensemble's encoder step; {name} is not an ensemble")
        return control.variant_config(repository, name, overrides, config=cfg), None
    overrides = dict(overrides)
    swap = overrides.pop(ENCODER, None)
    if "name" in overrides:
        raise ConfigError(
            f"{name}: name= would serve the encoder under another name than the ensemble's step names; drop it"
        )
    raw = overrides.pop(TOKENIZER_INSTANCES, None)
    count: int | None = None
    if raw is not None:
        try:
            count = int(raw)
        except ValueError:
            count = 0
        if count < 1:
            raise ConfigError(f"{name}: {TOKENIZER_INSTANCES}={raw!r}: give a positive number of instances")
    encoders: list[tuple[str, mc.ModelConfig]] = []
    steps: list[tuple[str, str]] = []
    for step in cfg.ensemble_scheduling.step:
        step_cfg = read_config(repository, step.model_name)
        if step_cfg is None:
            raise ConfigError(
                f"{name}: its step {step.model_name!r} has no config.pbtxt in {repository}; rebuild the repository "
                "(`inflight import-hf` writes the ensemble and its steps together)"
            )
        if step_cfg.backend != "tokenizer":
            if swap is not None:
                # the stand-in runs as many instances as the encoder it replaces, unless the spec says otherwise
                overrides.setdefault("instances", str(sum(g.count for g in step_cfg.instance_group) or 1))
                step_cfg = _replacement(repository, name, swap, step, step_cfg)
                step.model_name = swap
            encoders.append((step.model_name, step_cfg))
            continue
        if count is not None:
            del step_cfg.instance_group[:]
            step_cfg.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)
        steps.append((step.model_name, json_format.MessageToJson(step_cfg, preserving_proto_field_name=True)))
    if len(encoders) != 1:
        raise ConfigError(
            f"{name}: an ensemble the runner measures has one encoder step besides its tokenizer; its steps "
            f"{[s.model_name for s in cfg.ensemble_scheduling.step]} have {len(encoders)}"
        )
    encoder = control.variant_config(repository, encoders[0][0], overrides, config=encoders[0][1])
    config_json = json_format.MessageToJson(cfg, preserving_proto_field_name=True)
    return encoder, Ensemble(name=name, config_json=config_json, steps=tuple(steps))


def _replacement(
    repository: Path, name: str, model: str, step: mc.ModelEnsembling.Step, encoder: mc.ModelConfig
) -> mc.ModelConfig:
    """The config of ``model``, to stand in the ensemble ``name``'s encoder step (``encoder=model``).

    It must take the step's inputs and give its outputs, by name and datatype as the encoder does: checked here,
    before anything loads, rather than by Triton once the model and the tokenizer are loaded.
    """
    cfg = read_config(repository, model)
    if cfg is None:
        raise ConfigError(f"{name}: {ENCODER}={model!r} has no config.pbtxt in {repository}; name a model there")
    if cfg.platform == "ensemble" or cfg.backend == "tokenizer":
        raise ConfigError(f"{name}: {ENCODER}={model!r} is an ensemble or a tokenizer; name a model taking token ids")
    for what, wanted, mine, theirs in (
        ("input", step.input_map, encoder.input, cfg.input),
        ("output", step.output_map, encoder.output, cfg.output),
    ):
        types = {t.name: t.data_type for t in theirs}
        for t in mine:
            if t.name in wanted and types.get(t.name) != t.data_type:
                had = mc.DataType.Name(types[t.name]) if t.name in types else "none"
                raise ConfigError(
                    f"{name}: {ENCODER}={model!r} must have the {what} {t.name!r} of type "
                    f"{mc.DataType.Name(t.data_type)} as {step.model_name!r} does (it has {had}); name a model "
                    "with the encoder's inputs and outputs, such as its _null variant"
                )
    return cfg


def load_plan(repository: Path, spec: str) -> list[tuple[str, str]]:
    """What to load for ``name[@key=value,...]``, in order: ``(model name, configuration JSON)`` each.

    A model loads alone with the spec's overrides (``inflight.variants.apply_overrides``); an ensemble's
    encoder loads first (the spec's keys), then its other steps (``tokenizer_instances``), then the ensemble.

    Raises:
        ConfigError: for a bad spec or key (see :func:`resolve`).
        ServerError: when a config.pbtxt is missing.
    """
    return load_order(*resolve_spec(repository, *parse_variant_arg(spec)))


def load_order(encoder: VariantConfig, ensemble: Ensemble | None) -> list[tuple[str, str]]:
    """``(name, configuration JSON)`` to load in order: the model (an ensemble's encoder), then the ensemble's rest."""
    return [(encoder.model_name, encoder.to_json()), *(ensemble.after_encoder() if ensemble is not None else [])]


def unload_order(encoder: VariantConfig, ensemble: Ensemble | None) -> list[str]:
    """The names to unload, the reverse of :func:`load_order`: an ensemble first, its encoder last."""
    rest = [name for name, _ in ensemble.after_encoder()] if ensemble is not None else []
    return [*reversed(rest), encoder.model_name]
