#!/usr/bin/env bash
# compare_builds.sh BASE_REV: proves that a change of structure changed no behavior of the CPU target
# (on a GPU, scripts/check_gpu.sh checks the GPU build against the references). It builds the CPU
# trainer of BASE_REV (a commit, in a temporary worktree) and of the working tree, runs both on the test
# configurations below (the same flags, data and seeds), and requires byte-identical final model files,
# checkpoints (the same file names; the state files less their header and hash, which hold the run identity each run draws),
# JSONL logs (less the measured ms and tokens_per_s and the binary's path) and stdout loss lines.
#   single rank; dp=2 ZeRO-2 and ZeRO-3 with gradient accumulation; tp=2; pp=2 1F1B; pp=3 GPipe rematerialized;
#   pp=2 interleaved (2 virtual stages); pp=3 ZB-H1; 3D (dp2 tp2 pp2, ZeRO-1, 1F1B); recompute 3; dynamic
#   loss scaling with an injected overflow that is skipped (dp=2 ZeRO-1)
# Both builds run the same CPU matmul (llmc/matmul.h), as byte-identity needs: where both know
# --cpu-matmul, each its default (OpenBLAS where linked: the same bits at the one thread count used here,
# OMP_NUM_THREADS=1) or CPU_MATMUL=blas|reference for both; where BASE_REV predates the flag (its matmuls
# are the reference GEMM), the working tree's runs get --cpu-matmul reference.
# Usage: bash scripts/compare_builds.sh 181d0c0        (exit 0 when every configuration is identical)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:?usage: compare_builds.sh BASE_REV}
PY=${PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
TMP=$(mktemp -d); [ -z "${KEEP:-}" ] || echo "keeping $TMP"
trap 'git worktree remove --force "$TMP/base" >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$TMP"' EXIT

git worktree add --detach "$TMP/base" "$BASE" >/dev/null 2>&1
echo "building $BASE and the working tree (CPU target)"
make -s -C "$TMP/base" -j2 build/cpu/train_gpt >/dev/null
make -s -j2 build/cpu/train_gpt >/dev/null
declare -A BIN=([base]="$TMP/base/build/cpu/train_gpt" [new]="$PWD/build/cpu/train_gpt")
declare -A MATMUL=([base]="" [new]="")
if ! "${BIN[base]}" --help | grep -q -- --cpu-matmul; then
    MATMUL[new]="--cpu-matmul reference"
    echo "$BASE has no --cpu-matmul (reference GEMM only): the working tree runs with --cpu-matmul reference"
elif [ -n "${CPU_MATMUL:-}" ]; then
    MATMUL[base]="--cpu-matmul $CPU_MATMUL" MATMUL[new]="--cpu-matmul $CPU_MATMUL"
fi

"$PY" - "$TMP/tokens.bin" <<'PYEOF'
import random, struct, sys
random.seed(11)
ids = [random.randrange(512) for _ in range(40000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
    f.write(struct.pack("<%dH" % len(ids), *ids))
PYEOF
COMMON=(--layers 4 --channels 32 --heads 4 --vocab 512 --max-seq-len 16 --seq-len 16 --steps 8 --lr 1e-3
        --warmup 2 --val-every 4 --val-batches 2 --sample-every 0 --train-data "$TMP/tokens.bin"
        --val-data "$TMP/tokens.bin" --tokenizer "" --save-every 4)
CONFIGS=(
    "single|1|--batch-size 4"
    "dp2-zero2|2|--batch-size 2 --grad-accum 2 --zero 2"
    "dp2-zero3|2|--batch-size 2 --grad-accum 2 --zero 3"
    "tp2|2|--batch-size 4 --tp 2"
    "pp2-1f1b|2|--batch-size 4 --pp 2 --micro-batches 4 --schedule 1f1b"
    "pp3-gpipe-remat|3|--batch-size 4 --pp 3 --micro-batches 4 --schedule gpipe --pp-rematerialize 1"
    "pp2-interleaved|2|--batch-size 4 --pp 2 --micro-batches 4 --schedule interleaved --virtual-stages 2"
    "pp3-zbh1|3|--batch-size 6 --pp 3 --micro-batches 6 --schedule zb-h1"
    "3d|8|--batch-size 4 --dp 2 --tp 2 --pp 2 --zero 1 --micro-batches 4 --schedule 1f1b"
    "recompute3|1|--batch-size 4 --recompute 3"
    "loss-scale-skip|2|--batch-size 2 --zero 1 --loss-scale dynamic --loss-scale-init 1024 --fault-inf-rank 1 --fault-inf-step 5"
)

payload() {  # a state file less its 1024-byte header (which holds the run id) and its final 8-byte hash
    head -c $(($(stat -c %s "$1") - 8)) "$1" | tail -c +1025
}

fails=0
for entry in "${CONFIGS[@]}"; do
    IFS='|' read -r name np flags <<<"$entry"
    for side in base new; do
        out="$TMP/$side/$name"
        mkdir -p "$out"
        # shellcheck disable=SC2086
        if ! (cd "$out" && timeout 300 "${MPIRUN[@]}" -np "$np" "${BIN[$side]}" "${COMMON[@]}" $flags ${MATMUL[$side]} \
                --log log.jsonl --save-model model.bin --checkpoint-dir ck >stdout.txt 2>&1); then
            echo "  FAIL  $name: the $side build did not run:"; tail -3 "$out/stdout.txt"; fails=$((fails + 1))
            continue 2
        fi
        "$PY" - "$out" <<'PYEOF'
import json, re, sys
out = sys.argv[1]
with open(out + "/log.results", "w") as f:      # the JSONL log without its measurements
    for line in open(out + "/log.jsonl"):
        r = json.loads(line)
        for k in ("ms", "tokens_per_s"):
            r.pop(k, None)
        if "config" in r:
            r["config"].pop("argv")             # holds the binary's path
            r["config"].pop("cpu_matmul", None) # (a base may predate it; both sides ran the same matmul, above)
        print(json.dumps(r, sort_keys=True), file=f)
with open(out + "/stdout.results", "w") as f:   # stdout's results: loss lines up to lr, val losses, skips
    for line in open(out + "/stdout.txt"):
        if line.startswith("step") or "overflow" in line or "skipped" in line:
            print(re.sub(r"(lr [0-9.e+-]+).*", r"\1", line.rstrip()), file=f)
PYEOF
    done
    diffs=()
    cmp -s "$TMP/base/$name/model.bin" "$TMP/new/$name/model.bin" || diffs+=(model.bin)
    cmp -s "$TMP/base/$name/log.results" "$TMP/new/$name/log.results" || diffs+=(log)
    cmp -s "$TMP/base/$name/stdout.results" "$TMP/new/$name/stdout.results" || diffs+=(stdout)
    [ "$(cd "$TMP/base/$name/ck" && find . -type f | sort)" = "$(cd "$TMP/new/$name/ck" && find . -type f | sort)" ] \
        || diffs+=("the checkpoint files' names")
    for f in $(cd "$TMP/base/$name/ck" && find . -type f | sort); do
        case "$f" in
            *state_*) cmp -s <(payload "$TMP/base/$name/ck/$f") <(payload "$TMP/new/$name/ck/$f") || diffs+=("ck/$f") ;;
            *) cmp -s "$TMP/base/$name/ck/$f" "$TMP/new/$name/ck/$f" || diffs+=("ck/$f") ;;
        esac
    done
    nck=$(cd "$TMP/base/$name/ck" && find . -type f | wc -l)
    if [ ${#diffs[@]} -eq 0 ]; then
        echo "  ok    $name: model, log, loss lines and $nck checkpoint files identical"
    else
        echo "  FAIL  $name: differs in ${diffs[*]}"; fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ] && echo "compare_builds: every configuration identical to $BASE" || echo "compare_builds: $fails configuration(s) differ"
exit $((fails > 0))
