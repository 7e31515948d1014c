#!/usr/bin/env bash
# gpu_scripts.sh: the scripts a GPU run is made of, checked where there is no GPU, so that a short stay on
# a GPU is not lost to a broken script.
#   1. scripts/check_gpu.sh: its steps run in the order of their tiers, each name once, and every check the
#      fast-path verdict counts is a tier-1 step; with a budget of 0 every step is reported SKIP, the
#      verdict says none passed, the exit status is 1, and $OUT gets the summary and the logs' tarball, two
#      files (few files to copy off a GPU machine); --tier 1 keeps to tier 1; bad arguments exit 2;
#      --sources-hash follows the sources (a copy with one header changed hashes otherwise)
#   2. scripts/compare_losses.py on made-up logs: within the limit 0, over it 1, a missing log 77 (SKIP),
#      logs of different lengths 1
#   3. scripts/ncu_breakdown.py on a made-up Nsight Compute CSV (its "details" layout: a row per launch and
#      metric): launches and microseconds per step, a library kernel summed into the library line, each
#      ratio equal to the time over the floor printed beside it, and the step's time outside kernels
#   4. scripts/benchmark_gpu.py --dry-run: every variant's flags, llm.c's command, and bad variants refused
# usage: tests/gpu_scripts.sh
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "  ok    $*"; }
bad() { echo "  FAIL  $*"; fails=$((fails + 1)); }
check() {  # check NAME CMD...: CMD must succeed
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
}

echo "1. scripts/check_gpu.sh"
bash scripts/check_gpu.sh --list >"$TMP/list" || bad "--list exits 0"
list_ok() {  # tiers never decrease; names unique; at least 10 steps per tier
    awk 'NF >= 2 && $1 ~ /^[123]$/ { if ($1 < last) exit 1; last = $1; n[$1]++; if (seen[$2]++) exit 2 }
         END { if (n[1] < 10 || n[2] < 10 || n[3] < 10) exit 3 }' "$TMP/list"
}
check "--list: the steps in tier order, each name once, at least 10 per tier" list_ok
fast=$(sed -n '/^FAST_CHECKS=(/,/)/p' scripts/check_gpu.sh | tr -d '()' | sed 's/FAST_CHECKS=//' | tr -s ' \n' '\n' | grep -v '^$')
n_fast=$(echo "$fast" | wc -l)
fast_in_tier1() {
    local s
    for s in $fast; do grep -q "^1  $s " "$TMP/list" || { echo "    $s is not a tier-1 step"; return 1; }; done
}
check "the fast-path verdict's $n_fast checks are all tier-1 steps" fast_in_tier1

mkdir -p "$TMP/out"
OUT="$TMP/out" LOGS="$TMP/logs" PYTHON=$PY bash scripts/check_gpu.sh --budget 0 >"$TMP/skip.out" 2>&1
rc=$?
n_steps=$(grep -c '^[123]  ' "$TMP/list")
n_skip=$(grep -c '^SKIP ' "$TMP/out/summary.txt" 2>/dev/null)
[ "$rc" = 1 ] && ok "--budget 0: exit status 1" || bad "--budget 0: exit status $rc, expected 1"
[ "$n_skip" = "$n_steps" ] && ok "--budget 0: all $n_steps steps SKIP in \$OUT/summary.txt" \
    || bad "--budget 0: $n_skip SKIP lines in \$OUT/summary.txt, expected $n_steps"
grep -q "0 of $n_fast checks passed; not yet" "$TMP/out/summary.txt" && ok "--budget 0: the verdict says none of $n_fast passed" \
    || bad "--budget 0: no '0 of $n_fast checks passed; not yet' verdict"
tar -tzf "$TMP/out/gpu-check.tar.gz" 2>/dev/null | grep -q "logs/summary.txt" && ok "--budget 0: \$OUT/gpu-check.tar.gz holds the logs" \
    || bad "--budget 0: no tarball of the logs in \$OUT"
n_out=$(find "$TMP/out" -type f | wc -l)
[ "$n_out" = 2 ] && ok "\$OUT holds 2 files: the summary and the logs' tarball" || bad "\$OUT holds $n_out files, expected 2"
OUT="$TMP/out" LOGS="$TMP/logs" PYTHON=$PY bash scripts/check_gpu.sh --budget 0 --tier 1 >/dev/null 2>&1
n1=$(grep -c '^1  ' "$TMP/list")
n_skip=$(grep -c '^SKIP ' "$TMP/out/summary.txt")
[ "$n_skip" = "$n1" ] && ok "--tier 1: its $n1 steps only" || bad "--tier 1: $n_skip steps, expected $n1"
for a in "--tier 4" "--budget ten" "--frobnicate"; do
    # shellcheck disable=SC2086
    bash scripts/check_gpu.sh $a --list >/dev/null 2>"$TMP/err"
    rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && ok "'$a': one line, exit 2 ($(cat "$TMP/err"))" || bad "'$a': exit $rc"
done
h1=$(bash scripts/check_gpu.sh --sources-hash)
mkdir -p "$TMP/copy"
git ls-files -z | xargs -0 -I{} cp --parents {} "$TMP/copy/" 2>/dev/null || cp -r . "$TMP/copy"
h2=$(bash "$TMP/copy/scripts/check_gpu.sh" --sources-hash)
echo "// changed" >>"$TMP/copy/llmc/gelu.h"
h3=$(bash "$TMP/copy/scripts/check_gpu.sh" --sources-hash)
[[ $h1 =~ ^[0-9a-f]{16}$ ]] && [ "$h1" = "$h2" ] && [ "$h2" != "$h3" ] && ok "--sources-hash: $h1 in a copy too, $h3 once a header changed" \
    || bad "--sources-hash: '$h1', copy '$h2', changed '$h3'"

echo "2. scripts/compare_losses.py"
"$PY" - "$TMP" <<'EOF'
import json, sys
tmp = sys.argv[1]
def log(name, losses, skipped=()):
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        f.write(json.dumps({"config": 1}) + "\n")
        for i, x in enumerate(losses):
            f.write(json.dumps({"step": i, "loss": x, **({"skipped": True} if i in skipped else {})}) + "\n")
log("a", [10.0] * 20)
log("b", [10.1] * 20, skipped=(3,))   # |10.0 - 10.1| / 10.1 = 0.0099
log("c", [10.0] * 19)
EOF
cmp_rc() { "$PY" scripts/compare_losses.py "$@" >"$TMP/cmp.out" 2>&1; echo $?; }
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/b.jsonl" --limit 0.01)" = 0 ] && grep -q "relative 0.0099" "$TMP/cmp.out" && grep -q "b 1$" "$TMP/cmp.out" \
    && ok "0.0099 apart, limit 0.01: passes (and counts b's skipped step)" || { bad "0.0099 apart, limit 0.01"; cat "$TMP/cmp.out"; }
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/b.jsonl" --limit 0.009 --every)" = 1 ] && ok "0.0099 apart, limit 0.009, every step: fails" || bad "limit 0.009"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/nothing.jsonl")" = 77 ] && ok "a missing log: 77 (SKIP)" || bad "a missing log"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/c.jsonl")" = 1 ] && ok "20 steps against 19: fails" || bad "different lengths"

echo "3. scripts/ncu_breakdown.py"
{
    echo '==PROF== Connected to process 1234 (train_gpt)'
    echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    id=0
    for step in 1 2; do
        for i in $(seq 12); do  # 12 launches per step at 200 us
            echo "\"$id\",\"1234\",\"train_gpt\",\"127.0.0.1\",\"void flash_tc_forward_kernel<__nv_bfloat16>(const __nv_bfloat16 *, float *, int, int)\",\"1\",\"7\",\"(128, 1, 1)\",\"(16, 12, 16)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"usecond\",\"200.00\""
            id=$((id + 1))
        done
        for i in 1 2 3; do  # 3 launches of a library kernel per step at 1,500,000 ns
            echo "\"$id\",\"1234\",\"train_gpt\",\"127.0.0.1\",\"nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\",\"9.0\",\"Command line profiler metrics\",\"gpu__time_duration.sum\",\"nsecond\",\"1,500,000\""
            id=$((id + 1))
        done
    done
} >"$TMP/ncu.csv"
"$PY" scripts/ncu_breakdown.py "$TMP/ncu.csv" --steps 2 --path fast --step-ms 10 >"$TMP/ncu.out" 2>&1 || bad "ncu_breakdown.py exits 0"
breakdown_ok() {  # columns: name calls us/step share floor ratio
    awk '$1 == "flash_tc_forward_kernel" { f = ($2 == "12.0" && $3 == "2400.0" && $4 == "34.8%") ; r1 = $3 / $5 - $6 }
         $1 == "(cuBLAS(Lt)" { l = ($(NF-4) == "3.0" && $(NF-3) == "4500.0" && $(NF-2) == "65.2%"); r2 = $(NF) - $(NF-3) / $(NF-1) }
         /all kernels: 6.90 ms per step/ && /3.10 ms of it ran no kernel/ { t = 1 }
         END { exit !(f && l && t && r1 < 0.06 && r1 > -0.06 && r2 < 0.06 && r2 > -0.06) }' "$TMP/ncu.out"
}
check "per step: flash 12 launches, 2400 us (34.8%); library 3, 4500 us (65.2%); ratios = us / floor; 6.90 ms in kernels, 3.10 outside" breakdown_ok \
    || cat "$TMP/ncu.out"
echo '"ID","Kernel Name"' >"$TMP/bad.csv"
"$PY" scripts/ncu_breakdown.py "$TMP/bad.csv" --steps 1 >"$TMP/bad.out" 2>&1 && bad "a CSV without metrics is refused" \
    || { [ "$(wc -l <"$TMP/bad.out")" = 1 ] && ok "a CSV without metrics: one line ($(cat "$TMP/bad.out"))" || bad "a CSV without metrics: $(cat "$TMP/bad.out")"; }

echo "4. scripts/benchmark_gpu.py --dry-run"
"$PY" scripts/benchmark_gpu.py --dry-run --configs 124M:16 --variants classic,flash,fused,fast --llmc scripts --llmc-no-build >"$TMP/bench.out" 2>&1
dry_ok() {
    grep -q -- "--attention classic --fused-kernels 0$" "$TMP/bench.out" && grep -q -- "--attention flash --fused-kernels 0$" "$TMP/bench.out" &&
    grep -q -- "--attention classic --fused-kernels 1$" "$TMP/bench.out" && grep -q -- "--attention flash --fused-kernels 1$" "$TMP/bench.out" &&
    grep -q "scripts/train_gpt2cu -i data/devil_train.bin" "$TMP/bench.out" && grep -q "PyTorch torch.compile GPT-2 124M" "$TMP/bench.out"
}
check "the four variants' flags, llm.c's command and PyTorch's run are planned" dry_ok || cat "$TMP/bench.out"
"$PY" scripts/benchmark_gpu.py --dry-run --variants flash,turbo >"$TMP/bench.out" 2>&1 && bad "--variants turbo is refused" \
    || { grep -q "error: --variants" "$TMP/bench.out" && ok "--variants turbo: $(cat "$TMP/bench.out")" || bad "--variants turbo: $(cat "$TMP/bench.out")"; }

[ "$fails" = 0 ] && echo "gpu_scripts: all passed" || { echo "gpu_scripts: $fails failed"; exit 1; }
