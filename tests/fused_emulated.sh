#!/usr/bin/env bash
# fused_emulated.sh: the GPU target's --fused-kernels path on the CPU emulation of CUDA (make emulated),
# against the unfused run of the same binary, every loss (and logged gradient norm) to 1e-5 relative and
# the final parameters to 1e-5 relative norm in FP32 (the fused kernels sum in other orders: ~1e-7); FP16
# to 1e-3 (part 2, where it is justified).
# 1. Its token ids go to the device from pinned host buffers without waiting (llmc/device.h,
#    copy_host_buffer_to_device), and the emulation reads such a buffer only when the stream gets to the
#    copy (dev/emulate/README.md). A host that rewrote the ids of a micro-batch before their copy had run
#    would train on the wrong tokens: so a run with gradient accumulation (several micro-batches through
#    one activation set) and with pipelines (slots; 1F1B, interleaved with 2 chunks per stage, and ZB-H1,
#    whose deferred weight products take cuBLASLt's bias-gradient epilogue apart from the input pass's fc
#    bias gradient) must equal the unfused run.
# 2. Its optimizer step has no wait before AdamW (llmc/step_outputs.h): norm, clip factor and the skip
#    verdict are computed on the device and summed across ranks by device collectives. With a
#    --grad-clip small enough that every step is clipped (it moves the losses by ~6e-5 relative, six
#    times the tolerance), on one rank, with dp 2 (ZeRO-1 on the NCCL engine, ZeRO-0 on the MPI engine)
#    ZeRO-3 (3 layers: the gather slots reused, and marked stale after a device-decided step; with gradient
#    accumulation, whose reduced chunks are added up on the stream after each micro-batch's reductions,
#    which only the main stream waits for) and tp 2
#    (the split tensors' sum; part 1's pipelines have the stages' sum); then (given the FP16
#    binary) with dynamic loss scaling from a scale that overflows the first steps, growing every 3 clean
#    steps, and an inf injected at step 9 (at dp 2 ZeRO-0 on rank 1 only, so that only the max over the
#    world makes rank 0 skip it too; and at dp 2 ZeRO-3): the same steps skipped at the same scales (the
#    log's skip records, exactly; step 9 among them).
# 3. Without loss scaling an inf gradient ends the run at that step with the unfused run's line ("the
#    step was not applied"), with the same checkpoints (on one rank, and dp 2 ZeRO-1 on NCCL).
# On a GPU, scripts/check_gpu.sh runs it on build/gpu-fp32/train_gpt (parts 1 to 3, FP32; the two ranks
# there share a GPU, and take the MPI engine, unless the machine has two).
# usage: tests/fused_emulated.sh [build/emu-fp32/train_gpt [build/emu-fp16/train_gpt]]
set -u
BIN=${1:-build/emu-fp32/train_gpt}
BIN_FP16=${2:-}  # part 2's loss-scaling cases (optional)
BIN_FP32=$BIN
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run
export OMP_NUM_THREADS=1
echo "1. the token ids from pinned memory: gradient accumulation, a pipeline"
for par in "1|--batch-size 4 --grad-accum 3" "2|--batch-size 4 --pp 2 --micro-batches 2 --pp-schedule 1f1b" \
    "2|--batch-size 4 --pp 2 --micro-batches 2 --pp-schedule interleaved --virtual-stages 2 --layers 4" \
    "2|--batch-size 4 --pp 2 --micro-batches 2 --pp-schedule zb-h1"; do
    np=${par%%|*} args=${par#*|}
    # shellcheck disable=SC2086
    run "$np" $args --steps 4 --fused-kernels 0 --log "$TMP/plain.jsonl" --save-model "$TMP/plain.bin"
    # shellcheck disable=SC2086
    run "$np" $args --steps 4 --fused-kernels 1 --log "$TMP/fused.jsonl" --save-model "$TMP/fused.bin"
    compare "fused = unfused: $args" "$TMP/fused.jsonl" "$TMP/fused.bin" "$TMP/plain.jsonl" "$TMP/plain.bin"
done

# update NP NAME ARGS...: fused and unfused runs of ARGS on NP ranks, which must agree: losses, gradient
# norms and final parameters to $TOL relative (parameters: of the norm), the skip records exactly; and
# the clipping must bite (every norm above 10 x $CLIP)
update() {
    local np=$1 name=$2
    shift 2
    run "$np" "$@" --fused-kernels 0 --log "$TMP/plain.jsonl" --save-model "$TMP/plain.bin"
    run "$np" "$@" --fused-kernels 1 --log "$TMP/fused.jsonl" --save-model "$TMP/fused.bin"
    "$PY" - "$name" "$TMP" "$CLIP" "$TOL" <<'PYEOF' || fails=$((fails + 1))
import json, sys
import numpy as np
name, d, clip, tol = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def log(p):
    rows = [json.loads(l) for l in open(p)]
    return ({r["step"]: (r["loss"], r["grad_norm"]) for r in rows if "grad_norm" in r},
            [(r["step"], r["loss_scale"]) for r in rows if r.get("skipped")])
(f, f_skips), (p, p_skips) = log(f"{d}/fused.jsonl"), log(f"{d}/plain.jsonl")
if not p or set(f) != set(p):
    print(f"  FAIL  {name:30s} applied steps {sorted(f)}, unfused {sorted(p)}")
    sys.exit(1)
loss_err = max(abs(f[s][0] - p[s][0]) / p[s][0] for s in p)
norm_err = max(abs(f[s][1] - p[s][1]) / p[s][1] for s in p)
x, y = np.fromfile(f"{d}/fused.bin", "<f4", offset=1024), np.fromfile(f"{d}/plain.bin", "<f4", offset=1024)
param_err = float(np.linalg.norm(x - y) / np.linalg.norm(y))
clipped = all(n > 10 * clip for _, n in p.values())
must_skip = "FP16" in name  # the scaled cases overflow at their start and at the injected step 9
skips_ok = f_skips == p_skips and (not must_skip or 9 in [s for s, _ in p_skips])
ok = max(loss_err, norm_err, param_err) <= tol and skips_ok and clipped
print(f"  {'ok  ' if ok else 'FAIL'}  {name:30s} losses {loss_err:.1e}, norms {norm_err:.1e}, params {param_err:.1e} (tolerance {tol:g}); "
      f"{'clipped' if clipped else 'NOT clipped'}; skipped (step, scale): {f_skips}{'' if f_skips == p_skips else f', unfused {p_skips}'}")
sys.exit(0 if ok else 1)
PYEOF
}
echo "2. the optimizer step decided on the device: clipping, loss scaling and skipped steps"
# (EMU_DEVICES=2: the emulation's two GPUs, so that two ranks take the NCCL engine; a real GPU machine has its own)
emulated() { [[ "$("$BIN_FP32" --help)" == *"emulated on the CPU"* ]]; }
CLIP=1e-4 TOL=1e-5
export EMU_NCCL_DIR=$TMP/nccl EMU_NCCL_TIMEOUT=60
mkdir -p "$EMU_NCCL_DIR"
update 1 "clipped, 1 rank" --batch-size 4 --grad-accum 2 --steps 6 --grad-clip $CLIP
EMU_DEVICES=2 update 2 "clipped, dp 2 ZeRO-1 NCCL" --batch-size 2 --zero 1 --steps 6 --grad-clip $CLIP
if emulated && ! grep -q "engine NCCL" "$TMP/run.out"; then echo "  FAIL  dp 2 ZeRO-1 did not run on the NCCL engine"; fails=$((fails + 1)); fi
update 2 "clipped, dp 2 ZeRO-0 MPI" --batch-size 2 --steps 6 --grad-clip $CLIP
EMU_DEVICES=2 update 2 "clipped, dp 2 ZeRO-3 NCCL, accum 2" --batch-size 2 --grad-accum 2 --layers 3 --zero 3 --steps 6 --grad-clip $CLIP
EMU_DEVICES=2 update 2 "clipped, tp 2 NCCL" --batch-size 4 --tp 2 --steps 6 --grad-clip $CLIP
if [ -n "$BIN_FP16" ]; then
    # FP16: the gradients are rounded to fp16 (2^-11 relative) at different places by the fused kernels,
    # which moves norms and parameters by ~1e-4 (measured 9.5e-5 and 2.8e-5): an fp16 ulp, 1e-3
    BIN=$BIN_FP16 TOL=1e-3
    SCALING=(--steps 12 --grad-clip $CLIP --loss-scale dynamic --loss-scale-init 1048576 --loss-scale-interval 3 --fault-inf-step 9)
    update 1 "FP16 scaled, 1 rank" --batch-size 4 "${SCALING[@]}" --fault-inf-rank 0
    EMU_DEVICES=2 update 2 "FP16 scaled, dp 2 ZeRO-0 NCCL" --batch-size 2 "${SCALING[@]}" --fault-inf-rank 1
    EMU_DEVICES=2 update 2 "FP16 scaled, dp 2 ZeRO-3 NCCL" --batch-size 2 --layers 3 --zero 3 "${SCALING[@]}" --fault-inf-rank 1
fi
echo "3. an inf gradient without loss scaling: the run ends with the unfused run's line, the step not applied"
BIN=$BIN_FP32 CASES=("1|0" "2|1")  # NP|ZeRO stage (at dp 2 the norm is summed over both ranks: both see the inf)
for c in "${CASES[@]}"; do
    np=${c%%|*} zero=${c#*|}
    for F in 0 1; do
        EMU_DEVICES=$np timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" "${COMMON[@]}" --batch-size 2 --zero "$zero" --steps 4 --loss-scale off \
            --fault-inf-rank 0 --fault-inf-step 2 --save-every 1 --checkpoint-dir "$TMP/ck$F" >"$TMP/div$F.out" 2>&1
        echo "exit $?" >>"$TMP/div$F.out"
    done
    want="error: training diverged at step 2: the gradient norm is inf; the step was not applied and nothing after step 1 was saved"
    if grep -qxF "$want" "$TMP/div1.out" && grep -qx "exit 1" "$TMP/div1.out" && { [ "$np" = 1 ] || ! emulated || grep -q "engine NCCL" "$TMP/div1.out"; } && diff -q <(grep -E "^error|^exit" "$TMP/div0.out") \
        <(grep -E "^error|^exit" "$TMP/div1.out") >/dev/null && [ "$(ls "$TMP/ck0")" = "$(ls "$TMP/ck1")" ] && ! ls "$TMP/ck1" | grep -q 00000002
    then echo "  ok    $np rank(s), ZeRO-$zero: ends at step 2 as unfused, newest checkpoint step 1"
    else echo "  FAIL  $np rank(s), ZeRO-$zero:"; tail -3 "$TMP/div1.out"; ls "$TMP/ck1"; fails=$((fails + 1)); fi
    rm -rf "$TMP/ck0" "$TMP/ck1"
done
if [ $fails -ne 0 ]; then echo "fused_emulated: $fails FAILED"; exit 1; fi
echo "fused_emulated: all passed"
