#!/usr/bin/env bash
# checkpoints.sh: checkpoints and resuming on one rank (llmc/run/checkpoint.h, state_file.h, atomic_file.h; the
# sharded checkpoints of ZeRO: zero.sh; a resume after a signal: signals.sh).
#   resume errors: no checkpoint, another model, a model of another step, a corrupt or truncated state,
#   another batch shape or shuffle seed, --resume with --model; forged state files (step, update count,
#   non-finite moments, a step beyond an int) refused as they are read; a version 1 state file read; a
#   fresh run into another run's folder refused; folder names taken literally; the newest of 8- and
#   9-digit steps found by number
#   requeued jobs: --resume-if-present (fresh, then resumed: the model equals a straight run's), a resumed
#   run saves into its folder, --keep-last (deleting only checkpoint files, by their exact names, and
#   counting only resumable ones), a requeue after a kill during a run's first save (starts fresh)
#   rollback: no run saves into a folder that holds later checkpoints of its own run
#   resume on other training data: refused unless --allow-data-change (the same files moved are the same
#   data; a version 2 state file resumes unchecked, said once)
#   flags against the checkpoint: --stop-after at, and --steps below, the resumed step
#   crash and resume: the same samples and log lines as an uninterrupted run; a log line over 4 KiB kept
# Each refusal must be one clear line on stderr ("error: ...") and exit code 1, as in cli.sh.
#
# usage: tests/checkpoints.sh [path/to/train_gpt]   (default build/cpu/train_gpt; needs build/ref from
#        scripts/gpt2_reference.py)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/one_rank_lib.sh
source "$(dirname "$0")/one_rank_lib.sh"  # TINY, GOOD, expect_error, check; $TMP, $fails

# token files: good (1000 ids < 512), another of the same size (ids < 500), exactly one batch (17 ids)
"$PY" - "$TMP" <<'PYEOF'
import struct, sys
d = sys.argv[1]
def tokens(path, ids, magic=20240520, version=1, count=None):
    with open(path, "wb") as f:
        hdr = [magic, version, len(ids) if count is None else count] + [0] * 253
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack("<%dH" % len(ids), *ids))
tokens(f"{d}/good.bin", [i * 7 % 512 for i in range(1000)])
tokens(f"{d}/v500.bin", [i * 7 % 500 for i in range(1000)])  # for a vocabulary of 500 (Vp 512: padded rows)
tokens(f"{d}/t17.bin", list(range(17)))  # exactly one batch of B=2 x T=8 (+1)
PYEOF


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

echo "flags against the checkpoint"
expect_error "--stop-after at the resumed step" "--stop-after 2 is not after the step 2" "${GOOD[@]}" --resume "$TMP/ck" \
    --batch-size 2 --seq-len 8 --steps 4 --stop-after 2
expect_error "--steps below the resumed step" "--steps 1 is below the step 2" "${GOOD[@]}" --resume "$TMP/ck" --batch-size 2 --seq-len 8 --steps 1

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

if [ $fails -ne 0 ]; then echo "checkpoints: $fails FAILED"; exit 1; fi
echo "checkpoints: all passed"
