#!/usr/bin/env bash
# test_train.sh: runs the default training job (what `make train` runs) and checks that it learns: the
# last validation loss must be at least 2 nats below the first (the initial loss is about ln(50257) =
# 10.8 nats; a model that has learned the corpus' unigram statistics alone is below 8). Also checks the
# JSON log has a line per step and per evaluation. Prints the wall time; it is not asserted.
set -euo pipefail
BIN=${1:-build/cpu/train_gpt}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
"$BIN" --log "$TMP/log.jsonl" | tee "$TMP/out"
end=$(date +%s)
echo "default job took $((end - start)) s"
"${PYTHON:-/usr/bin/python3}" - "$TMP/log.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
val = [r["val_loss"] for r in rows if "val_loss" in r]
steps = [r for r in rows if "loss" in r]
assert all(k in r for r in steps for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s")), "missing keys"
assert len(steps) > 0 and len(val) >= 2, "log has no steps or fewer than two evaluations"
print(f"val loss: first {val[0]:.4f}, last {val[-1]:.4f}, drop {val[0] - val[-1]:.4f} nats (need >= 2)")
sys.exit(0 if val[0] - val[-1] >= 2.0 else 1)
PYEOF
grep -q "^sample: " "$TMP/out" || { echo "no sample was printed"; exit 1; }
echo "test_train: passed"
