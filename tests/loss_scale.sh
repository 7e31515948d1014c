#!/usr/bin/env bash
# loss_scale.sh: dynamic loss scaling on the CPU target (the logic is the same in every precision;
# FP16 is where it is needed). Two data-parallel ranks with ZeRO-1, and data that hold exactly one
# global batch, so every step sees the same tokens and a skipped step simply delays training by one.
#   A: 10 steps, rank 1 puts an inf into one of its gradients at step 5 (--fault-inf-*)
#   B: 9 steps, no fault
# Checks: step 5 of A is skipped and logged, the scale backs off (1024 -> 512); every rank skipped it
# (with ZeRO-1 each rank updates its own shard: had one rank stepped, the gathered model would differ);
# parameters and optimizer state after the skipped step equal those before it (A's checkpoint at step 5
# against B's at step 4, bytes of the model and of m and v); A's losses after the skip are B's shifted
# by one step; A's final model is byte-identical to B's (fp32: scaling by powers of two is exact); and
# resuming A from its step-6 checkpoint restores the scale and its counters (bit-exact final model).
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
"$PY" - "$TMP/tokens.bin" <<'PYEOF'
import random, struct, sys
random.seed(5)
ids = [random.randrange(512) for _ in range(100)]   # one global batch of 2 ranks x 2 x 16 (+1) tokens
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
    f.write(struct.pack("<%dH" % len(ids), *ids))
PYEOF
COMMON=(--layers 2 --channels 32 --heads 4 --vocab 512 --max-seq-len 16 --seq-len 16 --batch-size 2 --lr 1e-3
        --warmup 0 --lr-schedule constant --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer ""
        --zero 1 --loss-scale dynamic --loss-scale-init 1024)
run 2 --steps 10 --fault-inf-rank 1 --fault-inf-step 5 --log "$TMP/a.jsonl" --save-model "$TMP/a.bin" --save-every 1 --checkpoint-dir "$TMP/cka"
grep -h "overflowed" "$TMP/run.out" | sed 's/^/        /'
run 2 --steps 9 --log "$TMP/b.jsonl" --save-model "$TMP/b.bin" --save-every 1 --checkpoint-dir "$TMP/ckb"
# resume needs a checkpoint at 6: drop the later ones first, then resume from step 6
rm -f "$TMP"/cka/*_0000000[7-9]*.bin "$TMP"/cka/*_00000010*.bin
run 2 --steps 10 --fault-inf-rank 1 --fault-inf-step 5 --resume "$TMP/cka" --save-model "$TMP/ar.bin"
"$PY" - "$TMP" <<'PYEOF' || fails=$((fails + 1))
import json, struct, sys
d = sys.argv[1]
def log(p):
    return [json.loads(l) for l in open(p)]
a, b = log(f"{d}/a.jsonl"), log(f"{d}/b.jsonl")
la = {r["step"]: r["loss"] for r in a if "loss" in r}
lb = {r["step"]: r["loss"] for r in b if "loss" in r}
skips = [r for r in a if r.get("skipped")]
checks = []
checks.append(("step 5 skipped and logged, scale 1024 -> 512", [(r["step"], r["loss_scale"]) for r in skips] == [(5, 512)]))
checks.append(("losses before the skip equal", all(la[s] == lb[s] for s in range(1, 5))))
checks.append(("losses after the skip are B's one step later", all(la[s + 1] == lb[s] for s in range(5, 10))))
checks.append(("final model equals the clean run's with one step fewer", open(f"{d}/a.bin", "rb").read() == open(f"{d}/b.bin", "rb").read()))
checks.append(("model after the skipped step unchanged", open(f"{d}/cka/model_00000005.bin", "rb").read() == open(f"{d}/ckb/model_00000004.bin", "rb").read()))
def moments(path):  # the m and v payload of a state shard: after the header and ranges, before the checksum
    raw = open(path, "rb").read()
    n_ranges = struct.unpack_from("<q", raw, 26 * 4)[0]
    return raw[1024 + 16 * n_ranges:-8]
same_state = all(moments(f"{d}/cka/state_00000005_{s:05d}.bin") == moments(f"{d}/ckb/state_00000004_{s:05d}.bin") for s in (0, 1))
checks.append(("optimizer state after the skipped step unchanged (both shards)", same_state))
checks.append(("resumed from step 6: final model bit-exact", open(f"{d}/a.bin", "rb").read() == open(f"{d}/ar.bin", "rb").read()))
for name, ok in checks:
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
PYEOF

# The scale stops growing at its maximum, 2^24 (llmc/loss_scaler.h). --loss-scale-interval 1 doubles it
# after every clean step and fp32 gradients never overflow here, so uncapped it reached inf at about step
# 118: from then on every step was skipped (exit 0), every checkpoint held scale inf, which a resume
# refuses, and --keep-last 2 deleted the resumable ones. Here: 150 steps, none skipped, the two kept
# checkpoints hold 2^24, and the run resumes from the newest.
run 2 --steps 150 --loss-scale-interval 1 --save-every 10 --keep-last 2 --checkpoint-dir "$TMP/ckg" --log "$TMP/g.jsonl"
run 2 --steps 151 --loss-scale-interval 1 --resume "$TMP/ckg"
grep -q "resuming from step 150 of" "$TMP/run.out" && echo "  ok    --loss-scale-interval 1: resumed from step 150" \
    || { echo "  FAIL  --loss-scale-interval 1: no resume from step 150"; fails=$((fails + 1)); }
"$PY" - "$TMP" <<'PYEOF' || fails=$((fails + 1))
import json, os, struct, sys
d = sys.argv[1]
recs = [json.loads(l) for l in open(f"{d}/g.jsonl")]
applied = [r["step"] for r in recs if "loss" in r and not r.get("skipped")]
skipped = [r["step"] for r in recs if r.get("skipped")]
def scale(step):  # header int 30 of the first state shard: the loss scale (float32)
    return struct.unpack_from("<f", open(f"{d}/ckg/state_{step:08d}_00000.bin", "rb").read(), 30 * 4)[0]
checks = [("--loss-scale-interval 1, 150 steps: none skipped", skipped == [] and applied == list(range(1, 151))),
          ("--keep-last 2 kept steps 140 and 150", sorted(os.listdir(f"{d}/ckg")) == [f"model_{s:08d}.bin" for s in (140, 150)] +
           [f"state_{s:08d}_{r:05d}.bin" for s in (140, 150) for r in (0, 1)]),  # (ZeRO-1: a shard per rank)
          ("their scale is the maximum, 2^24", scale(140) == scale(150) == 2.0 ** 24)]
for name, ok in checks:
    print(f"  {'ok  ' if ok else 'FAIL'}  {name}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
PYEOF
# settings that cannot work are refused at start-up: a scale above the maximum (also a fixed one), and a
# dynamic scale that an overflow would not lower (it would then skip every later step)
expect_mpi_error "--loss-scale-init 1e30" "--loss-scale-init must be between 1 and 16777216" 1 "$BIN" "${COMMON[@]}" --loss-scale-init 1e30
expect_mpi_error "--loss-scale 1e9" "--loss-scale must be between 1 and 16777216" 1 "$BIN" "${COMMON[@]}" --loss-scale 1e9
expect_mpi_error "--loss-scale-backoff 1" "--loss-scale-backoff must be below 1" 1 "$BIN" "${COMMON[@]}" --loss-scale-backoff 1
if [ $fails -ne 0 ]; then echo "loss_scale: $fails FAILED"; exit 1; fi
echo "loss_scale: all passed"
