#!/usr/bin/env bash
# fused_emulated.sh: the GPU target's --fused-kernels path on the CPU emulation of CUDA (make emulated):
# its token ids go to the device from pinned host buffers without waiting (llmc/device.h,
# copy_host_buffer_to_device), and the emulation reads such a buffer only when the stream gets to the copy
# (dev/emulate/README.md). A host that rewrote the ids of a micro-batch before their copy had run would
# train on the wrong tokens: so a run with gradient accumulation (several micro-batches through one
# activation set) and with a pipeline (slots) must equal the unfused run, every loss to 1e-5 relative and
# the final parameters to 1e-5 relative norm (the fused kernels sum in other orders: ~1e-7 in FP32).
# On a GPU, scripts/check_gpu.sh runs it on build/gpu-fp32/train_gpt.
# usage: tests/fused_emulated.sh [build/emu-fp32/train_gpt]
set -u
BIN=${1:-build/emu-fp32/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run
export OMP_NUM_THREADS=1
for par in "1|--batch-size 4 --grad-accum 3" "2|--batch-size 4 --pp 2 --micro-batches 2 --schedule 1f1b"; do
    np=${par%%|*} args=${par#*|}
    # shellcheck disable=SC2086
    run "$np" $args --steps 4 --fused-kernels 0 --log "$TMP/plain.jsonl" --save-model "$TMP/plain.bin"
    # shellcheck disable=SC2086
    run "$np" $args --steps 4 --fused-kernels 1 --log "$TMP/fused.jsonl" --save-model "$TMP/fused.bin"
    compare "fused = unfused: $args" "$TMP/fused.jsonl" "$TMP/fused.bin" "$TMP/plain.jsonl" "$TMP/plain.bin"
done
if [ $fails -ne 0 ]; then echo "fused_emulated: $fails FAILED"; exit 1; fi
echo "fused_emulated: all passed"
