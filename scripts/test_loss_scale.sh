#!/usr/bin/env bash
# test_loss_scale.sh: dynamic loss scaling on the CPU target (the logic is the same in every precision;
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
# shellcheck source=scripts/parallel_test_lib.sh
source "$(dirname "$0")/parallel_test_lib.sh"
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
if [ $fails -ne 0 ]; then echo "test_loss_scale: $fails FAILED"; exit 1; fi
echo "test_loss_scale: all passed"
