"""The open-loop test's command-line lists: CPU lists as ``taskset -c`` takes them, GPU lists, offered rates."""

from __future__ import annotations

import math

from inflight.errors import ConfigError


def parse_cpus(text: str) -> list[int]:
    """Parse a CPU list as ``taskset -c`` takes it (``0-15``, ``0,2,4-7``).

    Raises:
        ConfigError: for anything else.
    """
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            a, dash, b = part.partition("-")
            first, last = int(a), int(b) if dash else int(a)
            if first < 0 or last < first:
                raise ValueError(part)
            cpus.update(range(first, last + 1))
    except ValueError:
        raise ConfigError(f"CPU list {text!r}: write it as taskset -c does, e.g. 0-15 or 0,2,4-7") from None
    if not cpus:
        raise ConfigError(f"CPU list {text!r} names no CPU")
    return sorted(cpus)


def parse_gpus(text: str) -> list[int]:
    """Parse a GPU list, ``0,1`` or ``0/1``, in the order given (duplicates kept for the caller to refuse).

    Raises:
        ConfigError: for an entry that is not a GPU index (an integer >= 0) or an empty list.
    """
    gpus = []
    for part in filter(None, (p.strip() for p in text.replace("/", ",").split(","))):
        if not part.isdigit():
            raise ConfigError(f"GPU list {text!r}: {part!r} is not a GPU index; write e.g. 0,1 or 0/1")
        gpus.append(int(part))
    if not gpus:
        raise ConfigError(f"GPU list {text!r} names no GPU; write e.g. 0,1 or 0/1")
    return gpus


def parse_rates(text: str) -> list[float]:
    """Parse ``--rate 1000,2000,4k`` (``k`` = thousand) into increasing rates.

    Raises:
        ConfigError: for a value that is not a positive number.
    """
    rates = []
    for part in filter(None, (p.strip().lower() for p in text.split(","))):
        try:
            value = float(part[:-1]) * 1000 if part.endswith("k") else float(part)
        except ValueError:
            raise ConfigError(f"--rate {text!r}: {part!r} is not a number of requests per second") from None
        if not value > 0 or not math.isfinite(value):
            raise ConfigError(f"--rate {text!r}: {part!r} must be > 0 requests per second")
        rates.append(value)
    if not rates:
        raise ConfigError(f"--rate {text!r} names no rate")
    return sorted(set(rates))
