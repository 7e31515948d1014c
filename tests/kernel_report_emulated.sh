#!/usr/bin/env bash
# kernel_report_emulated.sh: the static kernel report's step (dev/cuda/kernel_report.py, floors()) held to
# what a training step of the GPU code issues, on the CPU emulation of CUDA. With EMU_COUNTS set, the
# emulated train_gpt writes its kernel launches by name and its cuBLAS(Lt) FLOPs (2 m n k per product) at
# exit (dev/emulate/emulate_runtime.h); a run of 3 steps minus one of 2 is one steady step. floors(), at
# the same small shape, must give for the fast path (--fused-kernels 1 --attention flash) and the classic
# one (--fused-kernels 0 --attention classic):
#   - every kernel the step launches, with its calls per step, and no kernel it does not launch;
#   - the cuBLASLt matmuls' FLOPs and the classic attention's batched cuBLAS FLOPs, exactly (integers);
#   - the parameter count the trainer prints.
# The byte counts and the flash kernels' own FLOPs are not checked here (the emulation does not see them).
# usage: tests/kernel_report_emulated.sh [build/emu-bf16/train_gpt]
set -u
BIN=${1:-build/emu-bf16/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
make_tokens "$TMP/tokens.bin"
# the shape: 2 layers, head size 64 (flash's), T = maxT = 128; floors() gets the same numbers below
SHAPE=(--layers 2 --channels 128 --heads 2 --vocab 512 --max-seq-len 128 --seq-len 128 --batch-size 4)

for path in "fast:--fused-kernels 1 --attention flash" "classic:--fused-kernels 0 --attention classic"; do
    name=${path%%:*}
    read -r -a flags <<< "${path#*:}"
    ok=1
    for steps in 2 3; do
        EMU_COUNTS="$TMP/$name.$steps" timeout 300 "$BIN" "${SHAPE[@]}" --steps $steps --val-every 0 --sample-every 0 \
            --train-data "$TMP/tokens.bin" --tokenizer "" "${flags[@]}" >"$TMP/$name.$steps.log" 2>&1 \
            || { echo "  FAIL  $name: the emulated run of $steps steps failed:"; tail -3 "$TMP/$name.$steps.log"; ok=0; }
    done
    [ $ok = 1 ] || { fails=$((fails + 1)); continue; }
    if "$PY" - "$name" "$TMP/$name.2" "$TMP/$name.3" "$TMP/$name.3.log" <<'PYEOF'
import os, re, sys
sys.path.insert(0, os.path.join(os.getcwd(), "dev", "cuda"))
import kernel_report as kr

path, two, three, log = sys.argv[1:]
shape = dict(B=4, T=128, C=128, L=2, NH=2, V=512, maxT=128)  # the SHAPE flags above
rows, mm_flops, attention_classic, P = kr.floors(2, kr.header_constants(), shape)


def counts(f):
    out = {}
    for line in open(f):
        kind, name, n = line.split()
        out[(kind, name)] = int(n)
    return out


a, b = counts(two), counts(three)
step = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b)}
expected = {}
for k, p, calls, *_ in rows:
    if p in kr.PATH_ROWS[path] and not k.startswith("("):
        expected[k] = expected.get(k, 0) + calls
launched = {name: n for (kind, name), n in step.items() if kind == "launch" and n > 0}
bad = []
for k in sorted(set(expected) | set(launched)):
    if expected.get(k, 0) != launched.get(k, 0):
        bad.append(f"{k}: the report says {expected.get(k, 0)} calls per step, the step launched {launched.get(k, 0)}")
want = {"cublasLt": mm_flops, "cublas_batched": attention_classic if path == "classic" else 0}
for k, v in want.items():
    if step.get(("flops", k), 0) != v:
        bad.append(f"{k} FLOPs per step: the report says {v:,}, the step issued {step.get(('flops', k), 0):,}")
printed = int(re.search(r"(\d+) parameters", open(log).read()).group(1))
if printed != P:
    bad.append(f"parameters: the report says {P:,}, the trainer {printed:,}")
for line in bad:
    print("        " + line)
print(f"        {len(launched)} kernels, {sum(launched.values())} launches, {step.get(('flops', 'cublasLt'), 0):,} + "
      f"{step.get(('flops', 'cublas_batched'), 0):,} cuBLAS FLOPs per step")
sys.exit(1 if bad else 0)
PYEOF
    then echo "  ok    $name path: the report's calls, cuBLAS FLOPs and parameters are the emulated step's"
    else echo "  FAIL  $name path: the report and the emulated step differ (above)"; fails=$((fails + 1)); fi
done
[ $fails -eq 0 ] || { echo "kernel_report_emulated: $fails FAILED"; exit 1; }
echo "kernel_report_emulated: all passed"
