#!/usr/bin/env bash
# Issue 53 on the GPU host: all-MiniLM-L6-v2 served where the GPU is the bound.
#
# The model is imported as a user imports it (scripts/lab/minilm_gpu.sh PART=import: seeded random weights of
# the checkpoint's shape, which cost the GPU the same). Then, in one call:
#   1. the engine alone (scripts/lab/encoder_engine.py --variant served --varlen): tokens/s at 2,048 x 64, and
#      for 2,048 sequences of lengths 16-128 padded and unpadded: the engine bound of the served workload;
#   2. the served workload, open loop (Poisson, asyncio generator), 32 sequences a request of lengths
#      16-128 (`--length-dist real`), the variants VARIANTS interleaved over ROUNDS rounds at RATES, p99 SLO
#      100 ms. The null model is among them: the host's steadiness beside each sitting.
#
#   OUT=... VARIANTS="minilm_sync@instances=1 minilm_inflight@instances=1 minilm_null" bash scripts/lab/gpu_bound.sh
#   IMPORTS="minilm minilm2k:2048" ...: import each NAME[:MAX_BATCH] (default: minilm at the importer's batch)
#   IMPORT=0 ENGINE=0 ...: another run on the repository the first one imported
#   TOKENS=text VARIANTS="minilm_text@tokenizer_instances=4 minilm_inflight minilm_null" ...: the same requests as
#      text (`--token-dist text`; NAME_text is the ensemble users deploy for text), after the tokenizer's own bound
#      on the server's cores (scripts/lab/tokenizer_bound.py: $OUT/tokenizer.json; TOKENIZER_BOUND=0 skips it);
#      add minilm_text@encoder=minilm_null for the text path's own bound (tokenizer, ensemble, no GPU work; the null
#      model runs the encoder's instance count)
#
# Cores: server 0-7 (its stubs too), generator 8-15 (SERVER_CPUS, CLIENT_CPUS).
set -uo pipefail
source scripts/gpu_lib.sh
lab_call
RATES=${RATES:-1500,3000,4500}
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-minilm_sync@instances=1 minilm_inflight@instances=1 minilm_null}

if [ "${IMPORT:-1}" = 1 ]; then
  for spec in ${IMPORTS:-minilm}; do  # NAME[:MAX_BATCH] each, e.g. IMPORTS="minilm minilm2k:2048"
    name=${spec%%:*} batch=${spec#*:}
    [ "$batch" = "$spec" ] && batch=
    NAME=$name MAX_BATCH=$batch PART=import OUT="$OUT" SERVER_CPUS="$SERVER_CPUS" bash scripts/lab/minilm_gpu.sh 2>&1 \
      | grep -E "one instance|max_batch_size|imported|rror" | cut -c1-400
    grep -h -E "max_batch_size|count" "model_repository/${name}_inflight/config.pbtxt" | tr '\n' ' '; echo
  done
fi
if [ "${ENGINE:-1}" = 1 ]; then
  timeout "${ENGINE_TIMEOUT:-150}" $PY scripts/lab/encoder_engine.py --variant served --varlen --out "$OUT/engine.json" \
    2>&1 | grep -v -i warn | tail -n 12
fi
TOKENS=${TOKENS:-uniform}
if [ "$TOKENS" = text ] && [ "${TOKENIZER_BOUND:-1}" = 1 ]; then
  timeout 120 $PY scripts/lab/tokenizer_bound.py --repository model_repository --model minilm_inflight \
    --cpus "$SERVER_CPUS" --out "$OUT/tokenizer.json" 2>&1 | tail -n 6
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
# AB_TIMEOUT stops the run itself, not this script: `inflight ab` then stops its servers and keeps the windows it
# finished (interrupted-ab-*.json). A timeout around this script would leave the run and its servers going.
# shellcheck disable=SC2086  # VARIANTS is a list of words
timeout "${AB_TIMEOUT:-540}" inflight ab $VARIANTS --rate "$RATES" --repeat "$ROUNDS" --slo 100 --items 32 \
  --seq-len 128 --token-dist "$TOKENS" --length-dist real --window "${WINDOW:-4}" --warmup "${WARMUP:-2}" \
  --generator asyncio --processes 7 --server-cpus "$SERVER_CPUS" --client-cpus "$CLIENT_CPUS" \
  --out /tmp/ab-gpu-bound 2>&1 | grep --line-buffered -E "capacity at|offered .*achieved|sizing|one instance" \
  | tail -n "${TAIL:-40}"
# at most 8 files come back from a call: the run's JSON holds every figure
shopt -s nullglob
for f in /tmp/ab-gpu-bound/ab-*.json /tmp/ab-gpu-bound/interrupted-ab-*.json; do cp "$f" "$OUT/"; done
