#!/usr/bin/env bash
# Bad input must end in one clear line on stderr ("error: ...") and exit code 1: never a crash (a
# signal), a hang (timeout), silent garbage (exit 0) or a wall of text. Each case below feeds the trainer
# one kind of bad input and checks all of that, plus a word of the expected message. Also on one rank:
# token ids written into a shard under a running job, a diverging run (nothing non-finite is applied or
# saved), output paths checked before training (the signal checkpoint's folder, empty paths, paths too
# long), bounds on OMP_NUM_THREADS, --print-schedule and --plan, sampling (a cut --sample-len said, an
# empty vocab.bpe refused, a full stdout an error, no control characters from the decode table), and the
# CPU memory plan against the measured peak memory. Checkpoints and resuming (forged files, requeues,
# rollbacks, other training data, a crash and resume): checkpoints.sh.
#
# usage: tests/cli.sh [path/to/train_gpt]   (default build/cpu/train_gpt; needs build/ref from
#        scripts/gpt2_reference.py for the model-file cases)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/one_rank_lib.sh
source "$(dirname "$0")/one_rank_lib.sh"  # TINY, GOOD, expect_error, check; $TMP, $fails

# token files: good (1000 ids < 512), short (10 ids), one id too large, wrong magic, truncated
"$PY" - "$TMP" <<'PYEOF'
import struct, sys, os
d = sys.argv[1]
def tokens(path, ids, magic=20240520, version=1, count=None):
    with open(path, "wb") as f:
        hdr = [magic, version, len(ids) if count is None else count] + [0] * 253
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack("<%dH" % len(ids), *ids))
tokens(f"{d}/good.bin", [i * 7 % 512 for i in range(1000)])
tokens(f"{d}/v500.bin", [i * 7 % 500 for i in range(1000)])  # for a vocabulary of 500 (Vp 512: padded rows)
tokens(f"{d}/short.bin", list(range(10)))
tokens(f"{d}/bigid.bin", [1] * 500 + [600] + [1] * 499)
tokens(f"{d}/magic.bin", list(range(100)), magic=12345)
tokens(f"{d}/version.bin", list(range(100)), version=9)
tokens(f"{d}/trunc.bin", list(range(100)), count=200)
ref = open("build/ref/ref_small_model.bin", "rb").read()
open(f"{d}/model_trunc.bin", "wb").write(ref[: len(ref) // 2])
open(f"{d}/model_version.bin", "wb").write(ref[:4] + struct.pack("<i", 7) + ref[8:])
open(f"{d}/tok_bad.bin", "wb").write(struct.pack("<256i", *([1, 2] + [0] * 254)))
PYEOF


# finite_model FILE...: every value of these model files is finite (numpy)
finite_model() {
    "$PY" -c 'import sys, numpy as np; sys.exit(0 if all(np.isfinite(np.fromfile(p, "<f4", offset=1024)).all() for p in sys.argv[1:]) else 1)' "$@"
}

echo "command line"
expect_error "unknown flag" "unknown flag --bogus" "${TINY[@]}" "${GOOD[@]}" --bogus 1
expect_error "flag without value" "needs a value" "${TINY[@]}" "${GOOD[@]}" --steps
expect_error "non-numeric integer" "expects an integer" "${TINY[@]}" "${GOOD[@]}" --steps ten
expect_error "non-numeric float" "expects a number" "${TINY[@]}" "${GOOD[@]}" --lr fast
expect_error "attention kind" "--attention must be classic or flash" "${TINY[@]}" "${GOOD[@]}" --attention fast
# the CPU target and FP32 builds refuse the flash path; 16-bit GPU builds refuse head size 8 (TINY)
expect_error "attention flash refused" "attention flash" "${TINY[@]}" "${GOOD[@]}" --attention flash
expect_error "flash plan in fp32" "attention flash needs 16-bit" --plan --precision fp32 --attention flash --layers 2 \
    --channels 128 --heads 2 --max-seq-len 64 --seq-len 64
expect_error "trailing garbage" "expects an integer" "${TINY[@]}" "${GOOD[@]}" --batch-size 4x
expect_error "out of range" "must be between" "${TINY[@]}" "${GOOD[@]}" --batch-size 0
expect_error "--zero out of range" "--zero must be between 0 and 3" "${TINY[@]}" "${GOOD[@]}" --zero 4
expect_error "--fused-kernels out of range" "--fused-kernels must be between 0 and 1" "${TINY[@]}" "${GOOD[@]}" --fused-kernels 2
expect_error "--cpu-matmul kind" "--cpu-matmul must be blas or reference" "${TINY[@]}" "${GOOD[@]}" --cpu-matmul fast
expect_error "bad schedule" "lr-schedule" "${TINY[@]}" "${GOOD[@]}" --lr-schedule sawtooth
expect_error "C not divisible by NH" "not divisible" "${TINY[@]}" "${GOOD[@]}" --channels 18 --heads 4
expect_error "T > maxT (scratch)" "longer than maxT" "${TINY[@]}" "${GOOD[@]}" --seq-len 32
expect_error "T > maxT (model file)" "longer than the model's maxT" --model "$REF" --seq-len 100 "${GOOD[@]}" --steps 1 --val-every 0 --sample-every 0
expect_error "sizes differ from --model" "differ from the model file" --model "$REF" --layers 3 "${GOOD[@]}"
echo "model files"
expect_error "missing model" "cannot open" --model "$TMP/nope.bin" "${GOOD[@]}"
expect_error "truncated model" "truncated" --model "$TMP/model_trunc.bin" "${GOOD[@]}"
expect_error "wrong model magic" "not a GPT-2 model file" --model "$TMP/good.bin" "${GOOD[@]}"
expect_error "wrong model version" "unsupported model file version 7" --model "$TMP/model_version.bin" "${GOOD[@]}"
echo "data files"
expect_error "no matching data" "no token file matches" "${TINY[@]}" --train-data "$TMP/none_*.bin" --tokenizer ""
expect_error "data shorter than a batch" "fewer than one batch" "${TINY[@]}" --train-data "$TMP/short.bin" --val-data "" --tokenizer ""
expect_error "token id >= V" "token id 600 .* vocabulary size 512" "${TINY[@]}" --train-data "$TMP/bigid.bin" --val-data "" --tokenizer ""
expect_error "wrong data magic" "not a token file" "${TINY[@]}" --train-data "$TMP/magic.bin" --val-data "" --tokenizer ""
expect_error "wrong data version" "unsupported token file version 9" "${TINY[@]}" --train-data "$TMP/version.bin" --val-data "" --tokenizer ""
expect_error "truncated data" "truncated" "${TINY[@]}" --train-data "$TMP/trunc.bin" --val-data "" --tokenizer ""
expect_error "wrong tokenizer magic" "not a tokenizer file" "${TINY[@]}" "${GOOD[@]}" --tokenizer "$TMP/tok_bad.bin" --sample-every 1
echo "inputs that are not regular files (a FIFO with no writer blocked in fopen)"
mkfifo "$TMP/fifo"
expect_error "--model FIFO" "fifo' is not a regular file" --model "$TMP/fifo" "${GOOD[@]}" --batch-size 2 --seq-len 8
expect_error "--train-data FIFO" "fifo' is not a regular file" "${TINY[@]}" --train-data "$TMP/fifo" --val-data "" --tokenizer ""
expect_error "--val-data FIFO" "fifo' is not a regular file" "${TINY[@]}" --train-data "$TMP/good.bin" --val-data "$TMP/fifo" --val-every 1 --tokenizer ""
expect_error "--tokenizer FIFO" "fifo' is not a regular file" "${TINY[@]}" "${GOOD[@]}" --tokenizer "$TMP/fifo" --sample-every 1
expect_error "--model folder" "is not a regular file" --model "$TMP" "${GOOD[@]}" --batch-size 2 --seq-len 8
echo "flags against the model"
expect_error "GPT-2 tokenizer, --vocab 512" "has 50257 tokens, the model's vocabulary 512" "${TINY[@]}" "${GOOD[@]}" \
    --tokenizer data/gpt2_tokenizer.bin --sample-every 1
expect_error "--device-memory inf" "--device-memory must be a positive, finite size" "${TINY[@]}" --plan --device-memory inf
expect_error "--device-memory 1e308GiB" "--device-memory must be a positive, finite size" "${TINY[@]}" --plan --device-memory 1e308GiB
echo "sizes that must not crash, run unbounded or allocate absurdly"
# ~100000 OpenMP threads crashed inside the OpenMP runtime (a segfault) at the first parallel loop (the
# CPU target's: the GPU target runs one host thread and has no OpenMP to bound)
if cpu_target; then
    OMP_NUM_THREADS=100000 expect_error "OMP_NUM_THREADS=100000" "OMP_NUM_THREADS=100000 is more than 1024 threads per rank" "${TINY[@]}" "${GOOD[@]}"
else
    echo "  skip  OMP_NUM_THREADS=100000: the GPU target has no OpenMP"
fi
# a schedule of 1024 stages x 16384 micro-batches printed 1.8 GB of timeline; 4096 x 65536 looped with GBs
# of memory until killed
expect_error "--print-schedule huge" "--print-schedule prints at most 64 stages and 1024 micro-batches" --print-schedule --pp 256 \
    --batch-size 4096 --micro-batches 4096
expect_error "--plan, --pp x micro-batches huge" "--plan: --pp 4096 x 1048576 micro-batches x 1 chunks is more than" --plan --layers 4096 --channels 64 \
    --heads 1 --pp 4096 --batch-size 1048576 --micro-batches 1048576
# the plan counts, it does not allocate: B = T = 2^20 (4 TiB of host token ids per micro-batch) is planned
timeout 60 "$BIN" --plan --layers 4 --channels 64 --heads 1 --max-seq-len 1048576 --seq-len 1048576 --batch-size 1048576 >"$TMP/out" 2>&1
plan_rc=$?
check "--plan, B = T = 2^20: planned without allocating" eval '[ $plan_rc -eq 0 ] && grep -q "stage  0 .*total" "$TMP/out"'

echo "token files that change under a running job: each batch's ids checked as it is read"
# start-up checked the file; then ids are written into it (in place, as a data job regenerating a shard
# would): 65535 (past the embedding table) and, with --vocab 500, 505 (a padded row [V, Vp) that would
# train). The run stops with one line naming the file and position, at the next batch that holds one.
live_change() {  # live_change NAME ID ARGS...
    local name=$1 id=$2
    shift 2
    # 50,000 ids below 500: more than stdio buffers (a file that fits in its buffer is never read again)
    "$PY" -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, 50000, *[0] * 253) +
        struct.pack("<50000H", *[i * 7 % 500 for i in range(50000)]))' "$TMP/live.bin"
    rm -rf "$TMP/live.jsonl" "$TMP/live_ck"
    timeout 60 "$BIN" "$@" --train-data "$TMP/live.bin" --val-data "" --tokenizer "" --steps 1000000 --log "$TMP/live.jsonl" \
        --checkpoint-dir "$TMP/live_ck" >/dev/null 2>"$TMP/live.err" &
    local pid=$! i
    for i in $(seq 300); do grep -qs '"step": 1,' "$TMP/live.jsonl" && break; sleep 0.1; done
    "$PY" -c 'import struct, sys; f = open(sys.argv[1], "r+b"); f.seek(1024); f.write(struct.pack("<50000H", *[int(sys.argv[2])] * 50000))' \
        "$TMP/live.bin" "$id"
    wait $pid
    local rc=$?
    if [ $rc -eq 1 ] && [ "$(grep -c . "$TMP/live.err")" = 1 ] && \
        grep -q "^error: '$TMP/live.bin': token id $id at token [0-9]* is >= the vocabulary size" "$TMP/live.err"; then
        printf '  ok    %-28s %s\n' "$name" "$(cat "$TMP/live.err")"
    else
        printf '  FAIL  %-28s exit %d (want 1), stderr:\n' "$name" $rc
        sed 's/^/        /' "$TMP/live.err" | head -5
        fails=$((fails + 1))
    fi
}
live_change "id 65535 written mid-run" 65535 "${TINY[@]}"
live_change "id 505, V 500, mid-run" 505 "${TINY[@]}" --vocab 500

echo "CPU target: the memory plan against the peak resident memory of runs"
# (a GPU build's plan is of device memory, which resident host memory does not show: test_gpt checks it
# against the bytes allocated, tests/memory_plan_emulated.sh against the emulated device's)
if ! cpu_target; then
    echo "  skip  GPU target: its plan counts device memory, not this process's resident memory"
else
# The plan counts the model's buffers, the CPU matmuls' scratch and the host copies of loading and
# saving. Measured: peak RSS (getrusage of the child) minus the peak RSS of a tiny run (binary, libraries,
# MPI and OpenMP runtime, which the plan does not count). Tolerance: the plan may over-count by up to 10%
# (the allocator's placement of freed copies varies) and under-count by at most 3% (it must not
# promise memory that is not there). A checkpoint's plan counts the model's file-order copy, freed just
# before the state shard's copies are made: with OpenMP threads the heap keeps its space (measured ratio
# 1.022 at 2, 4, 8 threads), with one thread (OMP_NUM_THREADS=1) it reuses it (1.136), so there the plan
# less that copy must meet the same bounds.
"$PY" - "$BIN" "$TMP" <<'PYEOF' || fails=$((fails + 1))
import re, resource, struct, subprocess, sys
BIN, d = sys.argv[1], sys.argv[2]
ids = [i * 7 % 16384 for i in range(4000)]
with open(f"{d}/v16k.bin", "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)) + struct.pack("<%dH" % len(ids), *ids))
def peak_mib(args):  # in a fresh process, so that RUSAGE_CHILDREN holds this run only
    code = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    return int(subprocess.run([sys.executable, "-c", code, BIN] + args, capture_output=True, text=True, timeout=120).stdout) / 1024
common = ["--val-every", "0", "--sample-every", "0", "--tokenizer", "", "--steps", "2"]
tiny = ["--layers", "1", "--channels", "16", "--heads", "2", "--vocab", "512", "--max-seq-len", "16", "--batch-size", "2", "--seq-len", "8",
        "--train-data", f"{d}/good.bin"] + common
big = ["--layers", "2", "--channels", "256", "--heads", "4", "--vocab", "16384", "--max-seq-len", "64", "--batch-size", "2", "--seq-len", "16",
       "--train-data", f"{d}/v16k.bin"] + common
baseline = peak_mib(tiny)
ok = True
for name, extra in [("--save-model", ["--save-model", f"{d}/plan_m.bin"]), ("--stop-after 1 (checkpoint)", ["--stop-after", "1", "--checkpoint-dir", f"{d}/ck_plan"])]:
    measured = peak_mib(big + extra) - baseline
    out = subprocess.run([BIN] + big + extra + ["--plan"], capture_output=True, text=True, timeout=60).stdout
    planned = float(re.findall(r"total +([0-9.]+) GiB", out)[-1]) * 1024
    reusable = int(re.search(r"([0-9]+) parameters", out).group(1)) * 4 / 2**20 if "checkpoint" in name else 0.0
    good = 0.97 <= planned / measured <= 1.10 or 0.97 <= (planned - reusable) / measured <= 1.10
    ok &= good
    less = f", {(planned - reusable) / measured:.3f} less the file-order copy" if reusable else ""
    print(f"  {'ok  ' if good else 'FAIL'}  plan of a {name} run: {planned:.1f} MiB, measured {measured:.1f} MiB (ratio {planned / measured:.3f}{less}; want 0.97 to 1.10)")
sys.exit(0 if ok else 1)
PYEOF
fi

echo "output paths (checked before the first step)"
no_step_ran() { ! grep -q "^step " "$TMP/out"; }
expect_error "--save-model into no folder" "--save-model: folder '.*/nodir': No such file" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/nodir/m.bin"
check "--save-model into no folder: before training" no_step_ran
expect_error "--checkpoint-dir, no parent" "cannot create the folder" "${TINY[@]}" "${GOOD[@]}" --save-every 2 --checkpoint-dir "$TMP/nodir/ck"
check "--checkpoint-dir, no parent: before training" no_step_ran
# sysfs refuses new files even to root (a chmod'ed folder would not stop root)
expect_error "--checkpoint-dir read-only" "cannot create files in '/sys/kernel'" "${TINY[@]}" "${GOOD[@]}" --stop-after 1 --checkpoint-dir /sys/kernel
check "--checkpoint-dir read-only: before training" no_step_ran
# a stop signal saves into --checkpoint-dir with or without --save-every: checked for every run that trains
expect_error "signal checkpoint folder read-only" "--checkpoint-dir (where a stop signal saves): cannot create files in '/sys/kernel'" \
    "${TINY[@]}" "${GOOD[@]}" --checkpoint-dir /sys/kernel
check "signal checkpoint folder read-only: before training" no_step_ran
expect_error "signal checkpoint folder, no parent" "could not be created when needed: its parent folder '.*/nodir' does not exist" \
    "${TINY[@]}" "${GOOD[@]}" --checkpoint-dir "$TMP/nodir/ck"
check "signal checkpoint folder, no parent: not created" test ! -e "$TMP/nodir"
# empty paths and paths too long to write (with ".tmp" added while saving), refused before training
expect_error "--save-model \"\"" "--save-model: the path is empty" "${TINY[@]}" "${GOOD[@]}" --save-model ""
check "--save-model \"\": before training" no_step_ran
expect_error "--trace \"\"" "--trace: the path is empty" "${TINY[@]}" "${GOOD[@]}" --trace ""
expect_error "--checkpoint-dir \"\"" "--checkpoint-dir.*: the path is empty" "${TINY[@]}" "${GOOD[@]}" --stop-after 1 --checkpoint-dir ""
LONGDIR=$("$PY" -c 'import sys; d = sys.argv[1] + "/long"; print(d + "/" + "/".join(["c" * 8] * ((4060 - len(d)) // 9)))' "$TMP")
mkdir -p "$LONGDIR"
LONGFILE="$LONGDIR/$(printf 'm%.0s' $(seq $((4094 - ${#LONGDIR} - 1))))"  # 4094 characters: its ".tmp" is over PATH_MAX
expect_error "--save-model near PATH_MAX" "--save-model: the path is too long (4094 characters" "${TINY[@]}" "${GOOD[@]}" --save-model "$LONGFILE"
check "--save-model near PATH_MAX: before training" no_step_ran
expect_error "--save-model name too long" "the file name is too long for its folder" "${TINY[@]}" "${GOOD[@]}" \
    --save-model "$TMP/$(printf 'n%.0s' $(seq 253))"
# 4070 characters: its write probe fits, "/state_00000001_00000.bin.tmp" would not
expect_error "--checkpoint-dir near PATH_MAX" "--checkpoint-dir: the path is too long (4070 characters" "${TINY[@]}" "${GOOD[@]}" \
    --save-every 1 --checkpoint-dir "$LONGDIR/$(printf 'k%.0s' $(seq $((4070 - ${#LONGDIR} - 1))))"
check "--checkpoint-dir near PATH_MAX: before training" no_step_ran
expect_error "--trace into no folder" "--trace: folder '.*/nodir'" "${TINY[@]}" "${GOOD[@]}" --trace "$TMP/nodir/t.json"
check "--trace into no folder: before training" no_step_ran
# a file saved by renaming over its path replaced a FIFO, a symbolic link or (as root) /dev/null with a
# plain file; such paths are refused before training and left as they were
mkfifo "$TMP/out_fifo"
touch "$TMP/link_target" && ln -s "$TMP/link_target" "$TMP/link"
expect_error "--save-model a FIFO" "--save-model '.*/out_fifo' exists and is not a regular file (a FIFO)" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/out_fifo"
check "--save-model a FIFO: before training" no_step_ran
check "--save-model a FIFO: still a FIFO" test -p "$TMP/out_fifo"
expect_error "--save-model a symlink" "is not a regular file (a symbolic link)" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/link"
check "--save-model a symlink: still a link" test -L "$TMP/link"
# a device node of our own (root can make one; /dev/null itself is not put at risk by a test)
if mknod "$TMP/null" c 1 3 2>/dev/null; then
    expect_error "--save-model a device" "is not a regular file (a device or socket)" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/null"
    check "--save-model a device: still a device" test -c "$TMP/null"
fi
expect_error "--trace a FIFO" "--trace '.*/out_fifo' exists and is not a regular file" "${TINY[@]}" "${GOOD[@]}" --trace "$TMP/out_fifo"
expect_error "--log /dev/full" "cannot write the log '/dev/full'" "${TINY[@]}" "${GOOD[@]}" --log /dev/full

echo "divergence (nothing non-finite is ever applied or written)"
# the padded vocabulary rows (V=500, Vp=512) have zero gradients: eps=0 gave them 0/0 in AdamW
V500=(--train-data "$TMP/v500.bin" --val-data "$TMP/v500.bin" --tokenizer "")
expect_error "--eps 0" "--eps must be positive" "${TINY[@]}" "${V500[@]}" --vocab 500 --eps 0 --val-every 2 --save-model "$TMP/eps0.bin"
check "--eps 0 wrote no model" test ! -e "$TMP/eps0.bin"
# a model file with a NaN in a padded row of wte (row 505 of Vp=512) is a bad file, not a divergence
"$PY" - "$TMP/nanpad.bin" <<'PYEOF'
import struct, sys
import numpy as np
maxT, V, L, NH, C, Vp = 16, 500, 1, 2, 16, 512
n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
p = np.zeros(n, "<f4")
p[505 * C + 3] = np.nan
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240326, 3, maxT, V, L, NH, C, Vp] + [0] * 248)))
    f.write(p.tobytes())
PYEOF
expect_error "NaN in a padded wte row" "nanpad.bin' holds a non-finite parameter: wte\[505\]\[3\]" --model "$TMP/nanpad.bin" "${V500[@]}" \
    --batch-size 2 --seq-len 8 --steps 2 --val-every 0 --sample-every 0 --save-model "$TMP/nanpad_out.bin"
# an inf gradient at step 2 without loss scaling: the step is not applied, the newest checkpoint is step 1
expect_error "inf gradient at step 2" "diverged at step 2: the gradient norm is inf" "${TINY[@]}" "${GOOD[@]}" --steps 4 \
    --loss-scale off --fault-inf-rank 0 --fault-inf-step 2 --save-every 1 --checkpoint-dir "$TMP/ck_inf" --save-model "$TMP/inf.bin"
check "inf gradient: newest checkpoint is step 1, no model" \
    test "$(ls "$TMP/ck_inf")" = "$(printf 'model_00000001.bin\nstate_00000001_00000.bin')" -a ! -e "$TMP/inf.bin"
# a real divergence (lr 10, weight decay 10): every checkpoint written is finite
expect_error "diverging run" "training diverged at step" "${TINY[@]}" "${GOOD[@]}" --steps 60 --lr 10 --weight-decay 10 \
    --grad-clip 0 --warmup 0 --save-every 1 --checkpoint-dir "$TMP/ck_div" --save-model "$TMP/div.bin"
check "diverging run: every checkpoint finite, no model" eval 'finite_model "$TMP"/ck_div/model_*.bin && test ! -e "$TMP/div.bin"'

# The CPU target accepts --fused-kernels and runs the same reference loops: losses and gradient norms must
# agree in every printed digit (gradient accumulation and --recompute 2 included, as they take the fused
# paths of the layer forward on the GPU). On the GPU the fused kernels round differently: test_gpt checks them.
if cpu_target; then
    echo "fused kernels (CPU target)"
    for f in 0 1; do
        timeout 120 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 3 --grad-accum 2 --recompute 2 --fused-kernels $f \
            --log "$TMP/fused$f.jsonl" >/dev/null 2>&1 || echo "  (run with --fused-kernels $f failed)"
        grep -o '"loss": [^,]*\|"grad_norm": [^,]*' "$TMP/fused$f.jsonl" >"$TMP/fused$f.txt" 2>/dev/null
    done
    if [ -s "$TMP/fused0.txt" ] && [ "$(grep -c . "$TMP/fused0.txt")" -eq 6 ] && cmp -s "$TMP/fused0.txt" "$TMP/fused1.txt"; then
        echo "  ok    --fused-kernels 1 gives the same 3 losses and norms on the CPU"
    else
        echo "  FAIL  --fused-kernels 1 changed the CPU results (or a run failed)"
        fails=$((fails + 1))
    fi
fi

# --cpu-matmul: OpenBLAS and the reference GEMM sum in other orders, so a run's losses agree to fp32
# rounding (test_gpt bounds the layers and 10 steps of a model at 1e-5; 3 steps here, from the command line)
if cpu_target && "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 1 --cpu-matmul blas >/dev/null 2>&1; then
    echo "--cpu-matmul (CPU target)"
    for m in reference blas; do
        timeout 120 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 3 --cpu-matmul $m --log "$TMP/mm_$m.jsonl" >/dev/null 2>&1 \
            || echo "  (run with --cpu-matmul $m failed)"
    done
    check "--cpu-matmul blas: the same 3 losses as reference to 1e-5" "$PY" - "$TMP/mm_reference.jsonl" "$TMP/mm_blas.jsonl" <<'PYEOF'
import json, sys
runs = [[r["loss"] for r in map(json.loads, open(p)) if "loss" in r and "step" in r] for p in sys.argv[1:]]
sys.exit(0 if len(runs[0]) == 3 == len(runs[1]) and all(abs(a - b) <= 1e-5 * abs(a) for a, b in zip(*runs)) else 1)
PYEOF
fi

echo "--save-model-dtype bf16 (llm.c version 5)"
# the same 2 steps saved both ways; the bf16 file must be PyTorch's round-to-nearest-even of the fp32 one,
# exactly (header: version 5, sizes equal), and read back (--model, 0 steps, saved as fp32) it must give
# the bf16 values widened to fp32 exactly
"$BIN" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/m32.bin" >/dev/null 2>&1
"$BIN" "${TINY[@]}" "${GOOD[@]}" --save-model "$TMP/m16.bin" --save-model-dtype bf16 >/dev/null 2>&1
timeout 60 "$BIN" --model "$TMP/m16.bin" "${GOOD[@]}" --batch-size 2 --seq-len 8 --steps 0 --val-every 0 --sample-every 0 \
    --save-model "$TMP/m16_back.bin" >/dev/null 2>&1
check "bf16 file == torch bf16 rounding of the fp32 file; read back exactly" "$PY" - "$TMP" <<'PYEOF'
import sys, numpy as np, torch
d = sys.argv[1]
h32, h16, hb = (np.fromfile(f"{d}/{n}.bin", "<i4", count=256) for n in ("m32", "m16", "m16_back"))
p32 = np.fromfile(f"{d}/m32.bin", "<f4", offset=1024)
b16 = np.fromfile(f"{d}/m16.bin", "<u2", offset=1024)
back = np.fromfile(f"{d}/m16_back.bin", "<f4", offset=1024)
want = torch.from_numpy(p32.copy()).to(torch.bfloat16).view(torch.int16).numpy().view("<u2")
ok = h16[1] == 5 and hb[1] == 3 and (h16[2:8] == h32[2:8]).all() and len(b16) == len(p32) and (b16 == want).all()
ok = ok and (back.view("<u4") == (b16.astype("<u4") << 16)).all()
# not vacuous: rounding changed most values
ok = ok and (back != p32).mean() > 0.5
sys.exit(0 if ok else 1)
PYEOF
expect_error "--save-model-dtype fp8" "--save-model-dtype must be fp32 or bf16" "${TINY[@]}" "${GOOD[@]}" --save-model-dtype fp8
# A finite fp32 parameter beyond bf16's range (|x| >= 0x7F7F8000 = 3.3961e38 rounds to inf) makes the bf16
# save fail, naming it, with the file already at that path left as it was (no inf is ever written). Just
# below that bound (3.39e38) it rounds to bf16's largest finite value and is saved; the fp32 save of the
# huge model is fine, its values are finite.
"$PY" - "$TMP" <<'PYEOF'
import struct, sys
import numpy as np
d = sys.argv[1]
maxT, V, L, NH, C, Vp = 16, 512, 1, 2, 16, 512  # TINY's sizes
n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
fcw = Vp * C + maxT * C + 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C  # fcw's offset (llm.c order)
for name, value in (("huge", -3.4e38), ("edge", 3.39e38)):
    p = np.random.default_rng(1).normal(0, 0.02, n).astype("<f4")
    p[fcw + 5 * C + 7] = value  # fcw[5][7]
    with open(f"{d}/{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", *([20240326, 3, maxT, V, L, NH, C, Vp] + [0] * 248)))
        f.write(p.tobytes())
PYEOF
LOAD0=("${GOOD[@]}" --batch-size 2 --seq-len 8 --steps 0 --val-every 0 --sample-every 0)
cp "$TMP/m16.bin" "$TMP/keep16.bin"
expect_error "bf16 save, value beyond bf16" "--save-model-dtype bf16: parameter fcw\[5\]\[7\] = -3.4e+38 is beyond bf16's range" \
    --model "$TMP/huge.bin" "${LOAD0[@]}" --save-model "$TMP/keep16.bin" --save-model-dtype bf16
check "bf16 save refused: the old file is untouched, no temporary left" \
    eval 'cmp -s "$TMP/m16.bin" "$TMP/keep16.bin" && test ! -e "$TMP/keep16.bin.tmp"'
timeout 60 "$BIN" --model "$TMP/huge.bin" "${LOAD0[@]}" --save-model "$TMP/huge32.bin" >/dev/null 2>&1
check "the same model saved as fp32: written, finite" eval 'cmp -s "$TMP/huge.bin" "$TMP/huge32.bin" && finite_model "$TMP/huge32.bin"'
timeout 60 "$BIN" --model "$TMP/edge.bin" "${LOAD0[@]}" --save-model "$TMP/edge16.bin" --save-model-dtype bf16 >/dev/null 2>&1
check "3.39e38 saved as bf16's largest finite value (0x7F7F)" "$PY" -c '
import sys, numpy as np
b = np.fromfile(sys.argv[1], "<u2", offset=1024)
sys.exit(0 if b[9600 + 5 * 16 + 7] == 0x7F7F else 1)  # fcw[5][7]' "$TMP/edge16.bin"
echo "sampling: what it cannot do is said"
# a sample fits in --seq-len: a longer --sample-len is cut, and the run says so
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --vocab 50257 --tokenizer data/gpt2_tokenizer.bin --steps 1 --sample-every 1 --sample-len 20 \
    >"$TMP/out" 2>&1
check "--sample-len 20 with --seq-len 8: says it is cut to 7" grep -q "^--sample-len 20: samples have 7 tokens after the end-of-text token" "$TMP/out"
# an empty vocab.bpe would encode byte by byte (tokens the model never saw): refused
mkdir -p "$TMP/bpe_empty" && cp data/encoder.json "$TMP/bpe_empty/" && : >"$TMP/bpe_empty/vocab.bpe"
printf 'hello world\n' >"$TMP/hello.txt"
expect_error "empty vocab.bpe" "vocab.bpe' holds no merges" --encode "$TMP/hello.txt" --bpe-dir "$TMP/bpe_empty"
# a decode table's control characters reach no terminal: every token of this one holds an escape
# sequence (ESC, a C1 CSI in UTF-8, a carriage return), printed as visible \x.. escapes instead
"$PY" - "$TMP/tok_esc.bin" <<'PYEOF'
import struct, sys
tokens = [b"\x1b[2J\x1b]0;title\x07\xc2\x9b31m\r%d\t\n" % i for i in range(511)] + [b"<|endoftext|>"]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240328, 2, 512, 511] + [0] * 252)))
    f.write(b"".join(struct.pack("<B", len(t)) + t for t in tokens))
PYEOF
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --tokenizer "$TMP/tok_esc.bin" --steps 0 --sample-every 1 --sample-len 4 >"$TMP/out" 2>&1
check "sampling: no control bytes from the decode table, shown as \x1b" "$PY" -c '
import re, sys
out = open(sys.argv[1], "rb").read()
sys.exit(0 if b"\\x1b[2J\\x1b]0;title\\x07\\xc2\\x9b31m\\x0d" in out and not re.search(rb"[\x00-\x08\x0b-\x1f\x7f]|\xc2[\x80-\x9f]", out) else 1)' "$TMP/out"
# a sample that cannot be written (a full disk) is an error, not exit 0
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --vocab 50257 --tokenizer data/gpt2_tokenizer.bin --steps 0 --sample-len 4 >/dev/full 2>"$TMP/err"
full_rc=$?
check "sampling to /dev/full: exit 1, one line" eval '[ $full_rc -eq 1 ] && [ "$(grep -c . "$TMP/err")" = 1 ] && grep -q "^error: cannot write to standard output" "$TMP/err"'
echo "help"
if "$BIN" --help | grep -q -- "--train-data"; then echo "  ok    --help prints the flags"; else echo "  FAIL  --help"; fails=$((fails + 1)); fi
# the testing flags are listed apart (--help-testing), each one there and none among the training flags
testing_flags="--fault-rank --fault-step --fault-stop --fault-slow-save --fault-slow-sample --fault-wait-signal --fault-clock-skew --fault-inf-rank --fault-inf-step"
missing=""; for f in $testing_flags; do "$BIN" --help-testing | grep -q -- "$f" || missing="$missing $f"; done
if [ -z "$missing" ] && ! "$BIN" --help | grep -q -- "--fault-"; then echo "  ok    --help-testing lists the fault flags, --help none"
else echo "  FAIL  --help-testing (missing:$missing) or a --fault- flag in --help"; fails=$((fails + 1)); fi

if [ $fails -ne 0 ]; then echo "cli: $fails FAILED"; exit 1; fi
echo "cli: all passed"
