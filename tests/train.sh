#!/usr/bin/env bash
# train.sh: runs the default training job (what `make train` runs) and checks that it learns: the
# last validation loss must be at least 2 nats below the first (the initial loss is about ln(50257) =
# 10.8 nats; a model that has learned the corpus' unigram statistics alone is below 8). Also checks the
# JSON log has a line per step and per evaluation, and starts with the run's configuration; that each
# step line shows the elapsed time and an ETA; and that scripts/plot_log.py draws the log into a PNG with
# real content. Prints the wall time; it is not asserted.
# Multiple-choice accuracy (--eval-data, at steps 0 and 150) on 400 examples that scripts/make_eval_data.py
# builds from the validation text (a context, its true next token and three next tokens from elsewhere):
# chance is 25%, with a binomial standard deviation of sqrt(0.25 * 0.75 / 400) = 2.17 points. The untrained
# model (step 0) must be within 3 deviations of chance, [18.5%, 31.5%] (it measured 28.0%); the trained one
# more than 3 deviations above chance, > 31.5% (it measured 34.0%: a margin of 10 examples; the seeds
# are fixed, so the values repeat unless the arithmetic changes).
set -euo pipefail
BIN=${1:-build/cpu/train_gpt}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
"${PYTHON:-/usr/bin/python3}" scripts/make_eval_data.py --out "$TMP/eval.bin" --examples 400
"$BIN" --log "$TMP/log.jsonl" --eval-data "$TMP/eval.bin" --eval-every 150 | tee "$TMP/out"
end=$(date +%s)
echo "default job took $((end - start)) s"
"${PYTHON:-/usr/bin/python3}" - "$TMP/log.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
val = [r["val_loss"] for r in rows if "val_loss" in r]
steps = [r for r in rows if "loss" in r]
assert all(k in r for r in steps for k in ("step", "loss", "lr", "grad_norm", "tokens_per_s")), "missing keys"
assert len(steps) > 0 and len(val) >= 2, "log has no steps or fewer than two evaluations"
cfg = rows[0].get("config")
assert cfg is not None, "the log's first line is not the configuration"
assert all(k in cfg for k in ("argv", "target", "precision", "device", "world", "dp", "tp", "pp", "model", "batch")), "config keys"
assert cfg["model"]["L"] == 4 and cfg["model"]["C"] == 128 and cfg["world"] == 1 and cfg["device"], f"config values: {cfg}"
print(f"val loss: first {val[0]:.4f}, last {val[-1]:.4f}, drop {val[0] - val[-1]:.4f} nats (need >= 2)")
acc = [r["eval_accuracy"] for r in rows if "eval_accuracy" in r]
assert [r["step"] for r in rows if "eval_accuracy" in r] == [0, 150], "multiple-choice accuracy not logged at steps 0 and 150"
print(f"multiple-choice accuracy: untrained {acc[0]:.4f} (need 0.185..0.315), trained {acc[1]:.4f} (need > 0.315)")
sys.exit(0 if val[0] - val[-1] >= 2.0 and 0.185 <= acc[0] <= 0.315 and acc[1] > 0.315 else 1)
PYEOF
grep -q "^sample: " "$TMP/out" || { echo "no sample was printed"; exit 1; }
grep -q "^step   150/150 | .* | [0-9:]* elapsed, ETA 0:00$" "$TMP/out" || { echo "the last step line has no elapsed time and ETA 0:00"; exit 1; }
# the plot: a PNG whose panels hold curves: at least 0.2% of its pixels colored (neither white, nor the
# black and grays of text, frame and grid). Measured: a one-step log (the legend's color samples and a
# dot, no curve) gives 0.02%, a 4-step log's curves 0.5%; the 150 steps draw longer ones
"${PYTHON:-/usr/bin/python3}" scripts/plot_log.py "$TMP/log.jsonl" -o "$TMP/curves.png"
"${PYTHON:-/usr/bin/python3}" - "$TMP/curves.png" <<'PYEOF'
import sys
import matplotlib.image as mpimg
img = mpimg.imread(sys.argv[1])[..., :3]
colored = ((img.max(axis=2) - img.min(axis=2)) > 0.2).mean()
print(f"plot_log.py: {img.shape[1]}x{img.shape[0]} PNG, {100 * colored:.2f}% colored pixels (need >= 0.2%)")
sys.exit(0 if img.shape[0] >= 400 and img.shape[1] >= 600 and colored >= 0.002 else 1)
PYEOF
echo "train: passed"
