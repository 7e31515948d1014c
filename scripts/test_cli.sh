#!/usr/bin/env bash
# Bad input must end in one clear line on stderr ("error: ...") and exit code 1: never a crash (a
# signal), a hang (timeout), silent garbage (exit 0) or a wall of text. Each case below feeds the trainer
# one kind of bad input and checks all of that, plus a word of the expected message. Also on one rank:
# forged checkpoints (header fields, non-finite moments), --keep-last deleting only its own files, a
# rollback into a folder of later checkpoints and a resume on other training data (both refused), token
# ids written into a shard under a running job, a requeue after a kill during a run's first save
# (starts fresh), a diverging run (nothing non-finite is applied or saved), output paths checked before
# training (the signal checkpoint's folder, empty paths, paths too long), bounds on OMP_NUM_THREADS,
# --print-schedule and --plan, sampling (a cut --sample-len said, an empty vocab.bpe refused, a full
# stdout an error, no control characters from the decode table), a crash and resume (same samples and
# log lines as an uninterrupted run; a log line over 4 KiB kept), and the CPU memory plan against the
# measured peak memory.
#
# usage: scripts/test_cli.sh [path/to/train_gpt]   (default build/cpu/train_gpt; needs build/ref from
#        scripts/gpt2_reference.py for the model-file cases)
set -u
BIN=${1:-build/cpu/train_gpt}
PY=${PYTHON:-/usr/bin/python3}
REF=build/ref/ref_small_model.bin
[ -x "$BIN" ] || { echo "no trainer at $BIN"; exit 1; }
[ -f "$REF" ] || { echo "no reference model at $REF (run scripts/gpt2_reference.py first)"; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

# a small model and data that are fine, so each case changes exactly one thing
TINY=(--layers 1 --channels 16 --heads 2 --vocab 512 --max-seq-len 16 --batch-size 2 --seq-len 8 --steps 2
      --val-every 0 --sample-every 0)

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
tokens(f"{d}/t17.bin", list(range(17)))  # exactly one batch of B=2 x T=8 (+1)
tokens(f"{d}/bigid.bin", [1] * 500 + [600] + [1] * 499)
tokens(f"{d}/magic.bin", list(range(100)), magic=12345)
tokens(f"{d}/version.bin", list(range(100)), version=9)
tokens(f"{d}/trunc.bin", list(range(100)), count=200)
ref = open("build/ref/ref_small_model.bin", "rb").read()
open(f"{d}/model_trunc.bin", "wb").write(ref[: len(ref) // 2])
open(f"{d}/model_version.bin", "wb").write(ref[:4] + struct.pack("<i", 7) + ref[8:])
open(f"{d}/tok_bad.bin", "wb").write(struct.pack("<256i", *([1, 2] + [0] * 254)))
PYEOF
GOOD=(--train-data "$TMP/good.bin" --val-data "$TMP/good.bin" --tokenizer "")

# expect_error NAME PATTERN ARGS...: runs the trainer, checks exit code 1, one stderr line with PATTERN
expect_error() {
    local name=$1 pattern=$2
    shift 2
    timeout 60 "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    local lines
    lines=$(grep -c . "$TMP/err")
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q "^error: .*$pattern" "$TMP/err"; then
        printf '  ok    %-28s %s\n' "$name" "$(cat "$TMP/err")"
    else
        printf '  FAIL  %-28s exit %d (want 1), %d stderr lines (want 1), pattern "%s"\n' "$name" $rc "$lines" "$pattern"
        sed 's/^/        /' "$TMP/err" | head -5
        fails=$((fails + 1))
    fi
}

# finite_model FILE...: every value of these model files is finite (numpy)
finite_model() {
    "$PY" -c 'import sys, numpy as np; sys.exit(0 if all(np.isfinite(np.fromfile(p, "<f4", offset=1024)).all() for p in sys.argv[1:]) else 1)' "$@"
}
check() {  # check NAME CONDITION...: a shell condition that must hold
    local name=$1
    shift
    if "$@"; then printf '  ok    %s\n' "$name"; else printf '  FAIL  %s\n' "$name"; fails=$((fails + 1)); fi
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
expect_error "--zero out of range" "--zero must be between 0 and 2" "${TINY[@]}" "${GOOD[@]}" --zero 3
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
echo "checkpoints"
"$BIN" "${TINY[@]}" "${GOOD[@]}" --save-every 1 --checkpoint-dir "$TMP/ck" >/dev/null 2>&1 || { echo "  FAIL  could not write a checkpoint"; fails=$((fails + 1)); }
"$BIN" --layers 1 --channels 32 --heads 2 --vocab 512 --max-seq-len 16 --batch-size 2 --seq-len 8 --steps 1 \
    --val-every 0 --sample-every 0 "${GOOD[@]}" --save-every 1 --checkpoint-dir "$TMP/other" >/dev/null 2>&1
expect_error "resume: no checkpoint" "no checkpoint" "${GOOD[@]}" --resume "$TMP/empty" --batch-size 2 --seq-len 8
cp -r "$TMP/ck" "$TMP/ck_swap" && cp "$TMP/other/model_00000001.bin" "$TMP/ck_swap/model_00000002.bin"
# (a model of other sizes is refused by the state reader, before it allocates the moments)
expect_error "resume: another model" "other sizes .* than its model file" "${GOOD[@]}" --resume "$TMP/ck_swap" --batch-size 2 --seq-len 8 --steps 4
cp -r "$TMP/ck" "$TMP/ck_swap1" && cp "$TMP/ck/model_00000001.bin" "$TMP/ck_swap1/model_00000002.bin"
expect_error "resume: model of another step" "not the model saved" "${GOOD[@]}" --resume "$TMP/ck_swap1" --batch-size 2 --seq-len 8 --steps 4
cp -r "$TMP/ck" "$TMP/ck_flip" && printf '\x01' | dd of="$TMP/ck_flip/state_00000002_00000.bin" bs=1 seek=2000 conv=notrunc status=none
expect_error "resume: corrupt state" "checksum mismatch" "${GOOD[@]}" --resume "$TMP/ck_flip" --batch-size 2 --seq-len 8 --steps 4
cp -r "$TMP/ck" "$TMP/ck_trunc" && truncate -s 3000 "$TMP/ck_trunc/state_00000002_00000.bin"
expect_error "resume: truncated state" "truncated" "${GOOD[@]}" --resume "$TMP/ck_trunc" --batch-size 2 --seq-len 8 --steps 4
expect_error "resume: other batch shape" "resume needs the same" "${GOOD[@]}" --resume "$TMP/ck" --batch-size 4 --seq-len 8 --steps 4
"$BIN" "${TINY[@]}" "${GOOD[@]}" --shuffle 1 --save-every 1 --checkpoint-dir "$TMP/cks" >/dev/null 2>&1
expect_error "resume: other shuffle seed" "shuffled the data with --seed 1337" "${GOOD[@]}" --resume "$TMP/cks" --batch-size 2 --seq-len 8 --shuffle 1 --seed 5 --steps 4
expect_error "resume with --model" "do not also give --model" "${GOOD[@]}" --resume "$TMP/ck" --model "$REF"
FORGE=("$PY" "$(dirname "$0")/forge_state.py")
cp -r "$TMP/ck" "$TMP/ck_neg" && "${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_neg/state_00000002_00000.bin" step=-3
expect_error "resume: forged step -3" "step -3 is out of range" "${GOOD[@]}" --resume "$TMP/ck_neg" --batch-size 2 --seq-len 8 --steps 4
cp -r "$TMP/ck" "$TMP/ck_upd" && "${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_upd/state_00000002_00000.bin" updates=-5
expect_error "resume: forged updates -5" "-5 optimizer updates in 2 steps is impossible" "${GOOD[@]}" --resume "$TMP/ck_upd" --batch-size 2 --seq-len 8 --steps 4
# moments a run could not have written (NaN or infinite m, infinite or negative v) and a step beyond
# AdamW's int step number (its files named for that step): refused as they are read, not trained on
for forged in "m=nan|m = nan, v = .* of parameter 0: m must be finite" "v=inf|v = inf of parameter 0: .*v finite and >= 0" \
    "v=-1|v = -1 of parameter 0: .*v finite and >= 0" "step=2147483648 updates=2147483648|step 2147483648 is out of range (0 to 2147483647)"; do
    fields=${forged%%|*} step=00000002 steps=4
    [[ $fields == step=* ]] && step=2147483648 steps=2147483647
    rm -rf "$TMP/ck_forged" && mkdir "$TMP/ck_forged" && cp "$TMP/ck/model_00000002.bin" "$TMP/ck_forged/model_$step.bin"
    "${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_forged/state_${step}_00000.bin" $fields
    expect_error "resume: forged $fields" "${forged#*|}" "${GOOD[@]}" --resume "$TMP/ck_forged" --batch-size 2 --seq-len 8 --steps $steps
done
expect_error "--steps beyond an int" "--steps must be between 0 and 2147483647" --plan "${TINY[@]}" --steps 2147483648
# a version 1 state file (no run id) is still read
cp -r "$TMP/ck" "$TMP/ck_v1" && "${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_v1/state_00000002_00000.bin" version=1 run_id_lo=0 run_id_hi=0
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/ck_v1" --batch-size 2 --seq-len 8 --steps 3 --val-every 0 --sample-every 0 >"$TMP/out" 2>&1
check "resume from a version 1 state file" grep -q "resuming from step 2 of" "$TMP/out"
expect_error "fresh run into another run's folder" "holds checkpoints of another run" "${TINY[@]}" "${GOOD[@]}" --save-every 1 --checkpoint-dir "$TMP/ck"
# a folder name with glob metacharacters is taken literally
"$BIN" "${TINY[@]}" "${GOOD[@]}" --stop-after 1 --checkpoint-dir "$TMP/ck[1]" >/dev/null 2>&1
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/ck[1]" --batch-size 2 --seq-len 8 --steps 2 --val-every 0 --sample-every 0 >"$TMP/out" 2>&1
check "resume from a folder named ck[1]" grep -q "resuming from step 1 of" "$TMP/out"
# steps at or above 1e8 have 9 digits: the newest is found by number, not by name
mkdir -p "$TMP/ck_big"
"${FORGE[@]}" "$TMP/ck/state_00000001_00000.bin" "$TMP/ck_big/state_99999999_00000.bin" step=99999999
"${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_big/state_100000000_00000.bin" step=100000000
cp "$TMP/ck/model_00000001.bin" "$TMP/ck_big/model_99999999.bin" && cp "$TMP/ck/model_00000002.bin" "$TMP/ck_big/model_100000000.bin"
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/ck_big" --batch-size 2 --seq-len 8 --steps 100000001 --val-every 0 --sample-every 0 >"$TMP/out" 2>&1
check "newest of steps 99999999 and 100000000" grep -q "resuming from step 100000000 of" "$TMP/out"

echo "requeued jobs: --resume-if-present, --checkpoint-dir defaults to the resumed folder, --keep-last"
# one command line run twice (--steps 2, then --steps 4): fresh, then resumed; its final model equals a
# straight 4-step run's, byte for byte
RQ=("$BIN" "${TINY[@]}" "${GOOD[@]}" --save-every 1 --resume-if-present "$TMP/rq")
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 4 --save-model "$TMP/rq_straight.bin" >/dev/null 2>&1
timeout 60 "${RQ[@]}" --steps 2 >"$TMP/out" 2>&1
check "--resume-if-present, no folder: starts from scratch, saves there" \
    eval 'grep -q "no complete checkpoint in .*rq.: starting from scratch" "$TMP/out" && test -f "$TMP/rq/model_00000002.bin"'
timeout 60 "${RQ[@]}" --steps 4 --save-model "$TMP/rq_resumed.bin" >"$TMP/out" 2>&1
check "--resume-if-present, checkpoint there: resumes; model == straight run's" \
    eval 'grep -q "resuming from step 2 of" "$TMP/out" && cmp -s "$TMP/rq_straight.bin" "$TMP/rq_resumed.bin"'
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/rq" --batch-size 2 --seq-len 8 --steps 5 --save-every 1 --val-every 0 --sample-every 0 >/dev/null 2>&1
check "--resume DIR --save-every 1 saves into DIR" test -f "$TMP/rq/model_00000005.bin"
# --keep-last 2: after 5 saves only steps 4 and 5 remain, a leftover of an interrupted save of step 1 is
# gone, a file that is not a checkpoint stays
mkdir -p "$TMP/kl" && touch "$TMP/kl/model_00000001.bin.tmp" "$TMP/kl/notes.txt"
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 5 --save-every 1 --keep-last 2 --checkpoint-dir "$TMP/kl" >/dev/null 2>&1
check "--keep-last 2 keeps steps 4 and 5 only" test "$(ls "$TMP/kl" | tr '\n' ' ')" = \
    "model_00000004.bin model_00000005.bin notes.txt state_00000004_00000.bin state_00000005_00000.bin "
# --keep-last deletes only what a save writes, by its exact name: not a model file without a state
# shard of its step (a user's --save-model there), not names that only look alike ("model_1.bin", 9
# digits, a shard of 1 digit, ".bak", another program's ".tmp"); an unfinished write of ours goes
mkdir -p "$TMP/klx" && cp "$REF" "$TMP/klx/model_00000000.bin"
touch "$TMP/klx/"{model_1.bin,model_000000001.bin,model_00000001.bin.bak,model_1.bin.tmp,state_00000001_1.bin,state_1_00000.bin,x.tmp}
touch "$TMP/klx/"{model_00000000.bin.tmp,state_00000002_00001.bin.tmp}
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 5 --save-every 1 --keep-last 2 --checkpoint-dir "$TMP/klx" >/dev/null 2>&1
check "--keep-last deletes only checkpoint files by their exact names" test "$(LC_ALL=C ls "$TMP/klx" | tr '\n' ' ')" = \
    "model_00000000.bin model_000000001.bin model_00000001.bin.bak model_00000004.bin model_00000005.bin model_1.bin model_1.bin.tmp state_00000001_1.bin state_00000004_00000.bin state_00000005_00000.bin state_1_00000.bin x.tmp "
# only resumable checkpoints count as kept: with step 2's state forged out of range (a resume refuses it),
# --keep-last 3 after a resume to step 4 keeps 4, 3 and 1 (it counted step 2 and deleted step 1), and
# leaves step 2 (newer than the oldest kept) alone
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 3 --save-every 1 --checkpoint-dir "$TMP/kl3" >/dev/null 2>&1
"${FORGE[@]}" "$TMP/kl3/state_00000002_00000.bin" "$TMP/kl3/state_00000002_00000.bin" shuffle=7
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/kl3" --batch-size 2 --seq-len 8 --steps 4 --save-every 1 --keep-last 3 --val-every 0 \
    --sample-every 0 >/dev/null 2>&1
check "--keep-last 3 passes over an unresumable step 2: step 1 kept" test "$(ls "$TMP/kl3" | tr '\n' ' ')" = \
    "model_00000001.bin model_00000002.bin model_00000003.bin model_00000004.bin state_00000001_00000.bin state_00000002_00000.bin state_00000003_00000.bin state_00000004_00000.bin "
# a kill -9 during a run's first save leaves another run's incomplete checkpoint (a fresh start draws a
# new run id): no checkpoint, so the requeue starts fresh (deleting it), never "another run" forever.
# Here: step 2's first of 2 state shards and its model; a lone first shard; only ".tmp" files.
mkdir -p "$TMP/rqp1" "$TMP/rqp2" "$TMP/rqp3"
"${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/rqp1/state_00000002_00000.bin" num_shards=2
cp "$TMP/ck/model_00000002.bin" "$TMP/rqp1/"
cp "$TMP/ck/state_00000002_00000.bin" "$TMP/rqp2/"
touch "$TMP/rqp3/model_00000001.bin.tmp" "$TMP/rqp3/state_00000001_00000.bin.tmp"
for k in 1 2 3; do
    what=$(echo "first of 2 shards and model|a lone first shard|only .tmp files" | cut -d'|' -f$k)
    timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --save-every 1 --resume-if-present "$TMP/rqp$k" >"$TMP/out" 2>&1
    check "requeue after a kill in the first save ($what): starts fresh" eval 'grep -q "starting from scratch" "$TMP/out" && test \
        "$(ls "$TMP/rqp$k" | grep -v "\.tmp$" | tr "\n" " ")" = "model_00000001.bin model_00000002.bin state_00000001_00000.bin state_00000002_00000.bin "'
done
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 3 --save-every 1 --resume-if-present "$TMP/rqp1" >"$TMP/out" 2>&1
check "... and its next requeue resumes from step 2" grep -q "resuming from step 2 of" "$TMP/out"
# another run's incomplete checkpoint beside its complete one: refused, and nothing is deleted
mkdir -p "$TMP/rqp4" && cp "$TMP/ck/model_00000001.bin" "$TMP/ck/state_00000001_00000.bin" "$TMP/rqp4/"
cp "$TMP/ck/state_00000002_00000.bin" "$TMP/rqp4/"
expect_error "another run's checkpoints and a partial save" "holds checkpoints of another run" "${TINY[@]}" "${GOOD[@]}" --save-every 1 \
    --checkpoint-dir "$TMP/rqp4"
check "... left as they were" test "$(ls "$TMP/rqp4" | wc -l)" = 3
expect_error "--resume and --resume-if-present" "give --resume or --resume-if-present, not both" "${GOOD[@]}" --resume "$TMP/rq" --resume-if-present "$TMP/rq"
expect_error "--keep-last 0" "--keep-last must be between 1" "${TINY[@]}" "${GOOD[@]}" --keep-last 0

echo "rollback: no run saves into a folder that holds later checkpoints of its own run"
# lin holds steps 1 to 3 of one run, lin_old a copy of its step 1. Resumed from lin_old into lin, a run
# would overwrite steps 2 and 3 with another branch of the same run, and the next --resume lin would
# continue whichever branch saved the newest step: refused before training, lin left as it was.
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 3 --save-every 1 --checkpoint-dir "$TMP/lin" >/dev/null 2>&1
mkdir -p "$TMP/lin_old" && cp "$TMP/lin/model_00000001.bin" "$TMP/lin/state_00000001_00000.bin" "$TMP/lin_old/"
(cd "$TMP/lin" && md5sum *) >"$TMP/lin.md5"
expect_error "rollback into the later steps" "holds checkpoints of this run after step 1, where it resumes .*another --checkpoint-dir" "${GOOD[@]}" \
    --resume "$TMP/lin_old" --checkpoint-dir "$TMP/lin" --batch-size 2 --seq-len 8 --steps 4 --save-every 1
expect_error "rollback, --stop-after" "holds checkpoints of this run after step 1" "${GOOD[@]}" --resume "$TMP/lin_old" \
    --checkpoint-dir "$TMP/lin" --batch-size 2 --seq-len 8 --steps 4 --stop-after 2
check "a refused rollback leaves the folder as it was" eval '(cd "$TMP/lin" && md5sum --quiet -c "$TMP/lin.md5" && test "$(ls | wc -l)" = 6)'
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/lin_old" --batch-size 2 --seq-len 8 --steps 3 --save-every 1 --val-every 0 \
    --sample-every 0 >"$TMP/out" 2>&1
check "rollback into the copy's own folder trains" eval 'grep -q "resuming from step 1 of" "$TMP/out" && test -f "$TMP/lin_old/model_00000003.bin"'
# a requeue after a crash in the save of step 4 (its first state shard written, its model not): that
# partial save is no later checkpoint; the resumed run writes step 4 again and --keep-last prunes
"${FORGE[@]}" "$TMP/lin/state_00000003_00000.bin" "$TMP/lin/state_00000004_00000.bin" step=4
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/lin" --batch-size 2 --seq-len 8 --steps 5 --save-every 1 --keep-last 2 --val-every 0 \
    --sample-every 0 >"$TMP/out" 2>&1
check "requeue over a partial save of a later step" eval 'grep -q "resuming from step 3 of" "$TMP/out" && test "$(ls "$TMP/lin" | tr "\n" " ")" = \
    "model_00000004.bin model_00000005.bin state_00000004_00000.bin state_00000005_00000.bin "'
timeout 60 "$BIN" "${GOOD[@]}" --resume "$TMP/lin" --batch-size 2 --seq-len 8 --steps 6 --save-every 1 --val-every 0 --sample-every 0 >"$TMP/out" 2>&1
check "... and the next requeue resumes from step 5" grep -q "resuming from step 5 of" "$TMP/out"

echo "resume with other training data: refused unless --allow-data-change"
# ck was trained on good.bin. Another file of the same size, a 17-token file, an added shard: refused.
expect_error "resume: another data file" "trained on other data .*--allow-data-change" "${GOOD[@]}" --train-data "$TMP/v500.bin" \
    --resume "$TMP/ck" --batch-size 2 --seq-len 8 --steps 4
expect_error "resume: a 17-token file" "trained on other data (1 file, 1000 tokens; now 1 file, 17 tokens)" "${GOOD[@]}" \
    --train-data "$TMP/t17.bin" --resume "$TMP/ck" --batch-size 2 --seq-len 8 --steps 4
mkdir -p "$TMP/shards" && cp "$TMP/good.bin" "$TMP/shards/a.bin"
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" --train-data "$TMP/shards/*.bin" --save-every 1 --checkpoint-dir "$TMP/ck_sh" >/dev/null 2>&1
cp "$TMP/good.bin" "$TMP/shards/b.bin"
expect_error "resume: an added shard" "trained on other data (1 file, 1000 tokens; now 2 files, 2000 tokens)" "${GOOD[@]}" \
    --train-data "$TMP/shards/*.bin" --resume "$TMP/ck_sh" --batch-size 2 --seq-len 8 --steps 4
# the same files in another folder are the same data
mkdir -p "$TMP/moved" && cp "$TMP/good.bin" "$TMP/moved/good.bin"
timeout 60 "$BIN" "${GOOD[@]}" --train-data "$TMP/moved/good.bin" --resume "$TMP/ck" --batch-size 2 --seq-len 8 --steps 3 --val-every 0 \
    --sample-every 0 >"$TMP/out" 2>&1
check "resume: the same data moved to another folder" grep -q "resuming from step 2 of" "$TMP/out"
# meant: --allow-data-change says so in one line and trains; its checkpoints record the new data
cp -r "$TMP/ck" "$TMP/ck_dc"
timeout 60 "$BIN" "${GOOD[@]}" --train-data "$TMP/t17.bin" --allow-data-change --resume "$TMP/ck_dc" --batch-size 2 --seq-len 8 --steps 3 \
    --save-every 1 --val-every 0 --sample-every 0 >"$TMP/out" 2>&1
check "--allow-data-change: trains on the new data, says so" eval 'grep -q "^--allow-data-change: .*other data" "$TMP/out" && test -f "$TMP/ck_dc/model_00000003.bin"'
timeout 60 "$BIN" "${GOOD[@]}" --train-data "$TMP/t17.bin" --resume "$TMP/ck_dc" --batch-size 2 --seq-len 8 --steps 4 --val-every 0 \
    --sample-every 0 >"$TMP/out" 2>&1
check "... and its checkpoint records the new data" grep -q "resuming from step 3 of" "$TMP/out"
# a version 2 state file records no data: resumed, with a notice
cp -r "$TMP/ck" "$TMP/ck_v2" && "${FORGE[@]}" "$TMP/ck/state_00000002_00000.bin" "$TMP/ck_v2/state_00000002_00000.bin" version=2
timeout 60 "$BIN" "${GOOD[@]}" --train-data "$TMP/t17.bin" --resume "$TMP/ck_v2" --batch-size 2 --seq-len 8 --steps 3 --val-every 0 \
    --sample-every 0 >"$TMP/out" 2>&1
check "resume from a version 2 state file: data unchecked, said once" eval 'grep -q "resuming from step 2 of" "$TMP/out" && test "$(grep -c "records no fingerprint of its training data" "$TMP/out")" = 1'

echo "inputs that are not regular files (a FIFO with no writer blocked in fopen)"
mkfifo "$TMP/fifo"
expect_error "--model FIFO" "fifo' is not a regular file" --model "$TMP/fifo" "${GOOD[@]}" --batch-size 2 --seq-len 8
expect_error "--train-data FIFO" "fifo' is not a regular file" "${TINY[@]}" --train-data "$TMP/fifo" --val-data "" --tokenizer ""
expect_error "--val-data FIFO" "fifo' is not a regular file" "${TINY[@]}" --train-data "$TMP/good.bin" --val-data "$TMP/fifo" --val-every 1 --tokenizer ""
expect_error "--tokenizer FIFO" "fifo' is not a regular file" "${TINY[@]}" "${GOOD[@]}" --tokenizer "$TMP/fifo" --sample-every 1
expect_error "--model folder" "is not a regular file" --model "$TMP" "${GOOD[@]}" --batch-size 2 --seq-len 8
echo "flags against the model and the checkpoint"
expect_error "GPT-2 tokenizer, --vocab 512" "has 50257 tokens, the model's vocabulary 512" "${TINY[@]}" "${GOOD[@]}" \
    --tokenizer data/gpt2_tokenizer.bin --sample-every 1
expect_error "--stop-after at the resumed step" "--stop-after 2 is not after the step 2" "${GOOD[@]}" --resume "$TMP/ck" \
    --batch-size 2 --seq-len 8 --steps 4 --stop-after 2
expect_error "--steps below the resumed step" "--steps 1 is below the step 2" "${GOOD[@]}" --resume "$TMP/ck" --batch-size 2 --seq-len 8 --steps 1
expect_error "--device-memory inf" "--device-memory must be a positive, finite size" "${TINY[@]}" --plan --device-memory inf
expect_error "--device-memory 1e308GiB" "--device-memory must be a positive, finite size" "${TINY[@]}" --plan --device-memory 1e308GiB
echo "sizes that must not crash, run unbounded or allocate absurdly"
# ~100000 OpenMP threads crashed inside the OpenMP runtime (a segfault) at the first parallel loop
OMP_NUM_THREADS=100000 expect_error "OMP_NUM_THREADS=100000" "OMP_NUM_THREADS=100000 is more than 1024 threads per rank" "${TINY[@]}" "${GOOD[@]}"
# a schedule of 1024 stages x 16384 micro-batches printed 1.8 GB of timeline; 4096 x 65536 looped with GBs
# of memory until killed
expect_error "--print-schedule huge" "--print-schedule prints at most 64 stages and 1024 micro-batches" --print-schedule --pp 256 \
    --batch-size 4096 --micro-batches 4096
expect_error "--plan, --pp x micro-batches huge" "--plan: --pp 4096 x 1048576 micro-batches is more than" --plan --layers 4096 --channels 64 \
    --heads 1 --pp 4096 --batch-size 1048576 --micro-batches 1048576
# the plan counts, it does not allocate: B = T = 2^20 (4 TiB of host token ids per micro-batch) is planned
timeout 60 "$BIN" --plan --layers 4 --channels 64 --heads 1 --max-seq-len 1048576 --seq-len 1048576 --batch-size 1048576 >"$TMP/out" 2>&1
plan_rc=$?
check "--plan, B = T = 2^20: planned without allocating" eval '[ $plan_rc -eq 0 ] && grep -q "stage  0 .*total" "$TMP/out"'

echo "crash and resume: the same samples and log lines as an uninterrupted run"
# U runs 4 steps; C is killed at step 3 (after logging it) with a checkpoint at 2, and R resumes C
GPT2TOK=(--vocab 50257 --tokenizer data/gpt2_tokenizer.bin --sample-every 2 --sample-len 6 --val-every 2)
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" "${GPT2TOK[@]}" --steps 4 --log "$TMP/u.jsonl" >"$TMP/u.out" 2>&1
{ timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" "${GPT2TOK[@]}" --steps 4 --log "$TMP/r.jsonl" --save-every 2 --checkpoint-dir "$TMP/ck_crash" \
    --fault-rank 0 --fault-step 3 >"$TMP/c.out" 2>&1; } 2>/dev/null  # (no "Killed" line from the shell)
timeout 60 "$BIN" "${TINY[@]}" "${GOOD[@]}" "${GPT2TOK[@]}" --steps 4 --log "$TMP/r.jsonl" --resume "$TMP/ck_crash" >"$TMP/r.out" 2>&1
check "samples: crashed + resumed == uninterrupted (2 samples)" \
    test "$(grep -h '^sample:' "$TMP/c.out" "$TMP/r.out")" = "$(grep '^sample:' "$TMP/u.out")" -a "$(grep -c '^sample:' "$TMP/u.out")" = 2
# the log's steps and values, without the timings: every step once, as in the uninterrupted run
log_values() { "$PY" -c 'import json, sys; [print(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, open(sys.argv[1])) if "step" in r]' "$1"; }
check "log: crashed + resumed == uninterrupted (steps and values)" test "$(log_values "$TMP/r.jsonl")" = "$(log_values "$TMP/u.jsonl")"
# the configuration line opens the log, and the resume adds its own (kept through the log's trimming)
log_configs() { "$PY" -c 'import json, sys; [print(i, r["config"]["model"]["L"], r["config"].get("resumed_from")) for i, r in enumerate(map(json.loads, open(sys.argv[1]))) if "config" in r]' "$1"; }
check "log: configuration first, and one per resume" test "$(log_configs "$TMP/r.jsonl" | tr '\n' ' ')" = "0 1 None 5 1 2 "

# a configuration line longer than 4 KiB (it holds the command line: here two paths of 2,400
# characters) is kept by the log's trimming like any other, whole
LONG="$TMP/$(printf './%.0s' $(seq 1200))good.bin"
LONGRUN=("$BIN" "${TINY[@]}" --train-data "$LONG" --val-data "$LONG" --tokenizer "" --log "$TMP/long.jsonl")
timeout 60 "${LONGRUN[@]}" --steps 3 --save-every 2 --checkpoint-dir "$TMP/ck_long" >/dev/null 2>&1
timeout 60 "${LONGRUN[@]}" --steps 4 --resume "$TMP/ck_long" >/dev/null 2>&1
check "log: a configuration line over 4 KiB survives a resume" test "$("$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(sum("config" in r for r in rows), [r["step"] for r in rows if "step" in r], max(len(l) for l in open(sys.argv[1])) > 4096)' \
    "$TMP/long.jsonl" 2>&1)" = "2 [1, 2, 3, 4] True"

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
# against the bytes allocated, scripts/test_memory_plan_emulated.sh against the emulated device's)
if [[ "$("$BIN" --help)" != *"target CPU"* ]]; then
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
if "$BIN" --help | grep -q "target CPU"; then
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
if "$BIN" --help | grep -q "target CPU" && "$BIN" "${TINY[@]}" "${GOOD[@]}" --steps 1 --cpu-matmul blas >/dev/null 2>&1; then
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

if [ $fails -ne 0 ]; then echo "test_cli: $fails FAILED"; exit 1; fi
echo "test_cli: all passed"
