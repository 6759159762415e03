#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one call (GPU time is scarce): the kernel figures, the benchmark's GPU
# section (with the fused/plain loss ratio), and 1-GPU runs of FSDP2 and DeepSpeed (ZeRO-1, ZeRO-2) on NCCL.
# Results go under $OUT (default gpu_out/): one log per check, status.txt with each exit code and time,
# benchmarks.md (a copy of docs/benchmarks.md with the Kernels block rewritten) and bench/bench.md (the GPU section).
#   bash scripts/gpu_checks.sh            # an estimated 6 minutes on an H200 (not yet run on one)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
cp docs/benchmarks.md "$OUT/benchmarks.md"

check() {  # name, command...: run it, keep its log, record its exit code, show its last lines
  local name=$1; shift
  echo "== $name"
  local start=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s" | tee -a "$OUT/status.txt"
  tail -n 4 "$OUT/$name.log"
}

RUN="arch=crammed-bert data=sanity data.vocab_size=8192 train.max_steps=20 train.batch_size=256
     impl.microbatch_size=64 train.validation_sequences=128 train.checkpoint_every_minutes=null"
torchrun1() { $PY -m torch.distributed.run --standalone --nproc_per_node=1 pretrain.py $RUN "$@"; }

check kernels $PY scripts/bench_kernels.py --out "$OUT/kernels" --write-docs "$OUT/benchmarks.md" --max-seconds 150
# not --write-docs: the doc's bench block holds the CPU sections too; merge $OUT/bench/bench.md into it by hand
check bench_gpu $PY scripts/bench.py --sections gpu --out "$OUT/bench"
check fsdp2 torchrun1 impl=gpu impl.distributed=fsdp2 "hydra.run.dir=$OUT/fsdp2"
check deepspeed_zero1 torchrun1 impl=deepspeed "hydra.run.dir=$OUT/zero1"
check deepspeed_zero2 torchrun1 impl=deepspeed impl.deepspeed.zero_stage=2 "hydra.run.dir=$OUT/zero2"
cat "$OUT/status.txt"
