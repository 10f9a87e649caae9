"""The tokenizer's bound on the text workload: texts a second the server's cores can tokenize, as the backend does.

The texts are the load test's own (``inflight.loadtest.workload.draw_inputs``: ``--items 32 --seq-len 128
--token-dist text --length-dist real``, the model's spec read from the repository), tokenized by the backend's
``TextEncoder.encode_batch`` (the tokenizer step of ``NAME_text`` and the encoder's own ``text`` input run the
same code) in batches of ``--batch`` requests:

* ``one process``: one process on all of ``--cpus``, the tokenizer's own threads (rayon) across them;
* ``per core``: one single-threaded process (``RAYON_NUM_THREADS=1``) pinned to each core of ``--cpus``, side by
  side for ``--seconds``: the most the cores tokenize when every core does its own batches;

each for three calls: ``word_cache`` (the encoder as the backends build it: text through the word cache,
``inflight.runtime.wordpiece``), ``encode_batch_fast`` (``tokenizer_word_cache`` 0: the library alone, as the
plain backend and the backends before the word cache) and ``encode_batch`` (offsets kept, the call before
``encode_batch_fast``). The bound is the word cache's.

    python scripts/lab/tokenizer_bound.py --model minilm_inflight --cpus 0-7 --out tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

#: The calls measured, the backends' own first (its rows give the bound).
CALLS = ("word_cache", "encode_batch_fast", "encode_batch")


def cpu_list(spec: str) -> list[int]:
    """``0-3,6`` -> [0, 1, 2, 3, 6]."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def requests(spec: Any, n: int, items: int, seed: int) -> list[np.ndarray]:
    """``n`` requests' text arrays of the model ``spec``, drawn as the load test draws them."""
    from inflight.loadtest.workload import draw_inputs

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = draw_inputs(spec, items, seq_len=128, token_dist="text", length_dist="real", rng=rng)
        (a,) = x.values()
        out.append(a.astype(np.object_))
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Tokenize for ``args.seconds``; texts a second and a text's mean tokens."""
    from inflight.runtime.text import TextEncoder
    from inflight.variants import repository_spec

    spec = repository_spec(args.repository, args.model)
    tok = args.repository / args.model / "1" / "tokenizer.json"
    enc = TextEncoder(tok, max_len=spec.max_seq_len or 512, word_cache=0 if args.call != "word_cache" else 65536)
    if args.call == "encode_batch":  # the call before encode_batch_fast
        enc._encode = enc._tok.encode_batch
    reqs = requests(spec, 64, args.items, args.seed)
    batches = [reqs[i : i + args.batch] for i in range(0, len(reqs), args.batch)]
    for b in batches[:2]:  # warm up
        enc.encode_batch(b)
    texts = tokens = 0
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < args.seconds:
        for r in enc.encode_batch(batches[i % len(batches)]):
            assert not isinstance(r, Exception), r
            ids, mask = r
            texts += len(ids)
            tokens += int(mask.sum())
        i += 1
    wall = time.perf_counter() - t0
    return {"texts": texts, "tokens": tokens, "wall_s": wall, "texts_per_s": texts / wall}


def measure(args: argparse.Namespace, call: str, layout: str) -> dict[str, Any]:
    """One layout (``one process`` or ``per core``) of one call: its processes side by side, summed."""
    cores = cpu_list(args.cpus)
    me = [sys.executable, __file__, "--worker", "--repository", str(args.repository), "--model", args.model]
    common = ["--items", str(args.items), "--batch", str(args.batch), "--seconds", str(args.seconds), "--call", call]
    procs: list[tuple[str, dict[str, str]]]
    if layout == "one process":
        procs = [(",".join(map(str, cores)), {})]
    else:
        procs = [(str(c), {"RAYON_NUM_THREADS": "1"}) for c in cores]
    running = []
    for i, (cpus, env) in enumerate(procs):
        cmd = ["taskset", "-c", cpus, *me, *common, "--seed", str(args.seed + i)]
        running.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, env={**os.environ, **env}, text=True))
    results = [json.loads(p.communicate()[0]) for p in running]
    texts_per_s = sum(r["texts_per_s"] for r in results)
    return {
        "call": call,
        "layout": layout,
        "processes": len(procs),
        "texts_per_s": round(texts_per_s, 1),
        "requests_per_s": round(texts_per_s / args.items, 1),
        "us_per_text_per_core": round(len(cores) / texts_per_s * 1e6, 1),
        "tokens_per_text": round(sum(r["tokens"] for r in results) / sum(r["texts"] for r in results), 1),
    }


def main() -> None:
    """Measure every layout and call; print a line each, write the JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="minilm_inflight", help="a model with a text input and its tokenizer.json")
    p.add_argument("--cpus", default="0-7", help="the server's cores (taskset -c form)")
    p.add_argument("--items", type=int, default=32, help="texts a request")
    p.add_argument("--batch", type=int, default=8, help="requests tokenized together (one encode_batch)")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", default=",".join(CALLS), help="the calls measured, comma-separated (default: all)")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--call", default="encode_batch_fast", help=argparse.SUPPRESS)
    a = p.parse_args()
    calls = a.calls.split(",")
    unknown = [c for c in calls if c not in CALLS]
    if unknown:
        p.error(f"--calls: {unknown} not among {', '.join(CALLS)}")
    if a.worker:
        print(json.dumps(run(a)))
        return
    rows = []
    for call in calls:
        for layout in ("one process", "per core"):
            row = measure(a, call, layout)
            rows.append(row)
            print(
                f"{call:17s} {layout:11s} x{row['processes']}: {row['texts_per_s']:>10,.0f} texts/s = "
                f"{row['requests_per_s']:>8,.0f} req/s of {a.items}; {row['us_per_text_per_core']} us a text a core "
                f"({row['tokens_per_text']} tokens a text)",
                flush=True,
            )
    import tokenizers

    import inflight

    here = Path(inflight.__file__).parent
    commit = subprocess.run(["git", "-C", str(here), "describe", "--always", "--dirty"], capture_output=True, text=True)
    doc = {
        "what": "texts a second the cores tokenize with the backend's TextEncoder (the text workload's own texts)",
        "cpus": a.cpus,
        "cores": len(cpu_list(a.cpus)),
        "cpu_model": _cpu_model(),
        "tokenizers": tokenizers.__version__,
        "inflight": {"path": str(here), "commit": commit.stdout.strip() or None},  # PYTHONPATH may name another tree
        "model": a.model,
        "items": a.items,
        "batch_requests": a.batch,
        "seconds": a.seconds,
        "rows": rows,
        "bound_call": CALLS[0],
        # None where --calls left the bound's call out
        "bound_requests_per_s": max((r["requests_per_s"] for r in rows if r["call"] == CALLS[0]), default=None),
    }
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
