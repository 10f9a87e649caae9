"""Samples of one metric in Prometheus text (what Triton's metrics endpoint serves), by model."""

from __future__ import annotations

import re

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, metric: str, model: str | None) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of each sample of ``metric`` for ``model`` (all models if None) in Prometheus text."""
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(metric):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group("name") != metric:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        if model is None or labels.get("model") == model:
            out.append((labels, float(m.group("value"))))
    return out


def metric_values(text: str, metric: str, model: str | None) -> list[float]:
    """Values of ``metric`` for ``model`` (one per instance; all models if None) in Prometheus text, or []."""
    return [value for _, value in metric_samples(text, metric, model)]


def means_by_label(text: str, metric: str, model: str | None, label: str) -> dict[str, float]:
    """Mean of ``metric`` for ``model`` over the samples of each value of ``label`` (samples without it: ``""``)."""
    groups: dict[str, list[float]] = {}
    for labels, value in metric_samples(text, metric, model):
        groups.setdefault(labels.get(label, ""), []).append(value)
    return {key: sum(values) / len(values) for key, values in groups.items()}
