#!/usr/bin/env bash
# all-MiniLM-L6-v2 on the GPU host (issue 51): the GPU tests, and a short open-loop run of minilm_inflight
# beside minilm_plain, the model imported as a user imports it (`inflight import-hf`).
#
# The host has no network and a call carries 64 MiB: the real weights do not travel beside the offline kit,
# so the served runs use seeded random weights of the checkpoint's shape (what the GPU computes costs the
# same), written by transformers from the checkpoint's own config.json, with its tokenizer and pooling files
# (.minilm/, carried). The fp16 equality with the real weights runs without the kit (tests/gpu/test_minilm_gpu.py
# with INFLIGHT_MINILM_DIR).
#
#   PART=tests OUT=... bash scripts/lab/minilm_gpu.sh     # tests/gpu on GPU ${GPU:-0}, log in $OUT/tests-gpu.txt
#   PART=load  OUT=... bash scripts/lab/minilm_gpu.sh     # import + open loop, JSON in $OUT/<tokens>-ab-*.json
#   PART=bench OUT=... bash scripts/lab/minilm_gpu.sh     # import + `inflight bench-engine --model minilm`
#   PART=import OUT=... bash scripts/lab/minilm_gpu.sh    # the import alone (scripts/lab/gpu_bound.sh)
#   NAME=minilm2k MAX_BATCH=2048 PART=import ...           # a second import beside it: another name, larger batches
#
# Cores: server 0-7 (its stubs too), generator 8-15 (SERVER_CPUS, CLIENT_CPUS).
set -uo pipefail
source scripts/gpu_lib.sh
lab_call
PART=${PART:-tests}
RATES=${RATES:-250,1000,2000}

if [ "$PART" = tests ]; then
  # The suite is written for the one-GPU, 16-core host: the repository it builds is sized for the GPUs and cores
  # the process sees (inflight.build.configs). On a bigger host it runs on GPU $GPU and 16 cores, so the configs
  # are the same as there (a run on 4 x H100 and 64 cores, 2026-11-28, built them for four GPUs and 64 cores,
  # failed two tests and had not finished at 545 s; the cause was not confirmed). -v: a run cut off by the
  # timeout still names every test it finished.
  pin=()
  [ "$(nproc)" -gt 16 ] && pin=(taskset -c "${TEST_CPUS:-0-15}")
  CUDA_VISIBLE_DEVICES=${GPU:-0} timeout "${TESTS_TIMEOUT:-540}" "${pin[@]}" $PY -m pytest -v -p no:cacheprovider \
    tests/gpu -rs --durations=10 2>&1 | tee "$OUT/tests-gpu.txt"
  exit "${PIPESTATUS[0]}"
fi

ckpt=/tmp/minilm-random
$PY - <<'EOF'
import shutil
import sys
from pathlib import Path

# the kit's numpy 1.26 (the stub needs it) breaks the image's scipy/scikit-learn, which transformers imports lazily
sys.modules["scipy"] = sys.modules["sklearn"] = None  # type: ignore[assignment]
import torch
from transformers import BertConfig, BertModel

src, dst = Path(".minilm"), Path("/tmp/minilm-random")
torch.manual_seed(0)
model = BertModel(BertConfig.from_json_file(str(src / "config.json")), add_pooling_layer=False).eval()
model.save_pretrained(str(dst))
for f in ("tokenizer.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"):
    (dst / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / f, dst / f)
print("random-weight checkpoint of all-MiniLM-L6-v2's shape in", dst)
EOF
# what was imported (max_batch_size asked and written) beside the sitting's runs: the lab's "as built"
inflight import-hf "$ckpt" --name "${NAME:-minilm}" --server-cpus "$SERVER_CPUS" --gpus 1 --no-onnx \
  ${MAX_BATCH:+--max-batch-size "$MAX_BATCH"} | tee "$OUT/import-${NAME:-minilm}.json" | tail -c 400
[ "$PART" = import ] && exit 0
if [ "$PART" = bench ]; then
  inflight bench-engine --model minilm --batch 32 --batch 512 --seq-len "${SEQ:-128}" --iters "${ITERS:-50}" \
    --out "$OUT/engine-bench-minilm.json" 2>&1 | tail -n 30
  exit "${PIPESTATUS[0]}"
fi
for tokens in ${TOKENS:-text uniform}; do
  inflight ab "minilm_inflight@instances=${INSTANCES:-2},capture_at_load=false" "minilm_plain@instances=${INSTANCES:-2}" \
    --rate "$RATES" --items 32 --seq-len 128 --token-dist "$tokens" --length-dist real \
    --window "${WINDOW:-8}" --warmup "${WARMUP:-4}" --generator asyncio --processes 7 \
    --server-cpus "$SERVER_CPUS" --client-cpus "$CLIENT_CPUS" --out "/tmp/ab-$tokens" 2>&1 | tail -n 25
  # at most 8 files come back from a call: the run's JSON holds every figure
  for f in /tmp/ab-"$tokens"/ab-*.json; do cp "$f" "$OUT/$tokens-$(basename "$f")"; done
done
