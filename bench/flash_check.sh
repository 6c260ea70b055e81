#!/usr/bin/env bash
# The fused attention's first check on a GPU (HPU_FUSED_ATTENTION=1,
# worker/cuda/ops/cuops_flash.cu), in under a minute:
#   1. test_cuda_ops_more (its test_flash_attention: the kernels against
#      the unfused math in double and the host's rows; test_flash16 and
#      test_flash16_ops: the bf16 tensor-core tiles against the same tiles
#      on the CPU and the double math, and the ops running them; every
#      difference printed);
#   2. test_cuda_ops' fp8 tests (the scaling state's kernels, the fp8
#      bytes and cuBLASLt's fp8 products against the CPU);
#   3. GPT-2 124M bf16-mixed, B=16, T=1024, STEPS (6) steps on synthetic
#      llm.c tokens, fused then unfused: tokens/s (the first 2 steps left
#      out) and MaxInUse of each, and the final losses (which should agree
#      to about 1e-2).
#
#   bash bench/flash_check.sh BUILD     (from the repository root)
# Each step has its own timeout (LIMIT, 40 s); logs in OUT (./flash-out).
# DEVICE (cuda) and GPT (the model's size arguments) are for trying the
# script on a CPU at a small size: DEVICE=cpu GPT='--dim 32 --heads 4
# --layers 2 --ctx 32' BATCH=4.
set -uo pipefail
build=${1:?usage: bench/flash_check.sh BUILD}
build=$(cd "$build" && pwd) || exit 2
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-./flash-out}
mkdir -p "$out" && out=$(cd "$out" && pwd)
py=${PYTHON:-python3}
limit=${LIMIT:-40}
device=${DEVICE:-cuda}
read -r -a gpt <<<"${GPT:---dim 768 --heads 12 --layers 12 --ctx 1024}"

echo "== test_cuda_ops_more"
timeout -k 3 "$limit" env HPU_BUILD_DIR="$build" HPU_SOURCE_DIR="$root" "$build/bin/test_cuda_ops_more" \
  >"$out/test_cuda_ops_more.log" 2>&1
echo "rc=$? (0 passed, 77 skipped, 124 timed out)"
sed -n '/test_flash_attention/,/test_kernel_times\|PASSED\|FAILED/p' "$out/test_cuda_ops_more.log" | head -140
grep -a -E '^\[  (PASSED|FAILED)' "$out/test_cuda_ops_more.log"

echo "== test_cuda_ops test_fp8* (fp8's state on the device, its bytes and cuBLASLt's fp8 products)"
timeout -k 3 "$limit" env HPU_BUILD_DIR="$build" HPU_SOURCE_DIR="$root" HPU_TEST_FILTER='test_fp8*' \
  "$build/bin/test_cuda_ops" >"$out/test_cuda_ops_fp8.log" 2>&1
echo "rc=$? (0 passed, 77 skipped, 124 timed out)"
grep -a -E 'fp8|RUN|OK|FAIL|ERROR|LINE|PASSED' "$out/test_cuda_ops_fp8.log" | head -40

echo "== the kernels at a GPT-2 layer's shape (test_cuda_ops_more --bench)"
timeout -k 3 "$limit" env HPU_BUILD_DIR="$build" "$build/bin/test_cuda_ops_more" --bench 2>&1 | grep -a '^bench:'

tok=$out/tokens.bin
"$py" - "$tok" <<'PY'
import array, os, struct, sys
n = 1 << 18
t = array.array("H", (x % 50257 for x in array.array("H", os.urandom(2 * n))))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + t.tobytes())
PY
for f in 1 0; do
  name=gpt2-fused-$f
  echo "== GPT-2 (${gpt[*]}) bf16-mixed B=${BATCH:-16} on $device, HPU_FUSED_ATTENTION=$f"
  HPU_FUSED_ATTENTION=$f timeout -k 3 "$limit" "$build/bin/hpulaunch" -q --device "$device" --devices 1 \
    --precision bf16-mixed --batch-size "${BATCH:-16}" --max-steps "${STEPS:-6}" --throughput-warmup-steps 2 \
    --optimizer adamw --lr 1e-3 --no-eval --log-every 1 --metrics "$out/$name.jsonl" \
    "$build/lib/gpt_lm.so" -- "${gpt[@]}" --vocab 50304 --tokens "$tok" --dropout 0 --gen 0 \
    >"$out/$name.log" 2>&1
  echo "rc=$?"
  grep -a -iE 'loss|error|fail|cannot|fused' "$out/$name.log" | tail -4
  [ -s "$out/$name.jsonl" ] && "$py" - "$out/$name.jsonl" "${gpt[@]}" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
a = sys.argv[2:]
t = int(a[a.index("--ctx") + 1]) if "--ctx" in a else 64
print(f"tokens/s {r['samples_per_sec'] * t:.0f}  MaxInUse {r['device'][0]['MaxInUse'] / 2**30:.2f} GiB")
PY
done
