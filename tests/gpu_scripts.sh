#!/usr/bin/env bash
# gpu_scripts.sh: the scripts a GPU run is made of, checked where there is no GPU, so that a short stay on
# a GPU is not lost to a broken script.
#   1. scripts/check_gpu.sh: its steps run in the order of their tiers, each name once, and every check the
#      fast-path verdict counts is a tier-1 step; with a budget of 0 every step is reported SKIP, the
#      verdict says none passed, the exit status is 1, and $OUT gets the summary and the logs' tarball, two
#      files (few files to copy off a GPU machine); --tier 1 keeps to tier 1; --only keeps to the steps it
#      names (and gpu, build), of any tier, and refuses a name no step has; bad arguments exit 2;
#      --sources-hash follows the sources (a copy with one header changed hashes otherwise);
#      scripts/prepare_gpu_run.sh refuses bad arguments in one line before it builds anything
#   2. scripts/compare_losses.py on made-up logs: within the limit 0 (a skipped step, logged without a loss,
#      left out), over it 1, a log short of --steps 1, more skips than --max-skipped 1, a loss that is not
#      a number 1, a missing log 77 (SKIP), logs of different steps 1
#   3. scripts/ncu_breakdown.py on a made-up Nsight Compute CSV (its "details" layout: a row per launch and
#      metric): launches and microseconds per step, a library kernel summed into the library line, each
#      ratio equal to the time over the floor printed beside it, and the step's time outside kernels
#   4. scripts/benchmark_gpu.py --dry-run: every variant's flags, llm.c's command, and bad variants refused
#   5. check_gpu.sh --tier 1 in a copy of the checkout with stand-ins for the GPU binaries (in a bundle
#      with its stamp), nvidia-smi, ncu, mpirun and llm.c: the bundle is used, every step's verdict is the
#      one its stand-in decides (a comparison whose run failed part-way SKIPs), the fast-path verdict
#      names what did not pass, the benchmark and the breakdown read what they should; a step that hangs
#      is stopped at the budget and the rest SKIP; a step that needs more of the budget than is left is
#      not started, and the quick ones after it run; a TERM during a step stops the run at once, the
#      summary naming the step and $OUT/current.log holding its output so far
# usage: tests/gpu_scripts.sh
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "  ok    $*"; }
bad() { echo "  FAIL  $*"; fails=$((fails + 1)); }
copy_checkout() {  # copy_checkout DEST: this checkout's tracked files and new ones (as a GPU machine gets them)
    mkdir -p "$1"
    git ls-files -co --exclude-standard -z | xargs -0 -I{} cp --parents {} "$1/"
}
check() {  # check NAME CMD...: CMD must succeed (the status is CMD's, for a `|| show what failed`)
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; return 1; fi
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
[ "$n_fast" -ge 5 ] || bad "FAST_CHECKS read from scripts/check_gpu.sh: only $n_fast names"
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
OUT="$TMP/out" LOGS="$TMP/logs" PYTHON=$PY bash scripts/check_gpu.sh --budget 0 --tier 1 --only zero_fp32,benchmark_torch >/dev/null 2>&1
only=$(awk '/^SKIP / { print $3 }' "$TMP/out/summary.txt" | tr '\n' ' ')
[ "$only" = "gpu build benchmark_torch zero_fp32 " ] && ok "--tier 1 --only zero_fp32,benchmark_torch: gpu, build and those two, in the run's order" \
    || bad "--tier 1 --only zero_fp32,benchmark_torch: steps '$only'"
for a in "zero_fp32,no_such_step|no_such_step" "zero_fp32, cli_gpu| cli_gpu" "zero.fp32|zero.fp32"; do
    bash scripts/check_gpu.sh --only "${a%%|*}" >/dev/null 2>"$TMP/err"
    rc=$?
    [ "$rc" = 2 ] && grep -qF "no step is named '${a#*|}'" "$TMP/err" && ok "--only '${a%%|*}': exit 2, naming '${a#*|}'" \
        || bad "--only '${a%%|*}': exit $rc, stderr: $(cat "$TMP/err")"
done
for a in "--tier 4" "--budget ten" "--frobnicate"; do
    # shellcheck disable=SC2086
    bash scripts/check_gpu.sh $a --list >/dev/null 2>"$TMP/err"
    rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && ok "'$a': one line, exit 2 ($(cat "$TMP/err"))" || bad "'$a': exit $rc"
done
h1=$(bash scripts/check_gpu.sh --sources-hash)
copy_checkout "$TMP/copy"
h2=$(bash "$TMP/copy/scripts/check_gpu.sh" --sources-hash)
echo "// changed" >>"$TMP/copy/llmc/gelu.h"
h3=$(bash "$TMP/copy/scripts/check_gpu.sh" --sources-hash)
[[ $h1 =~ ^[0-9a-f]{16}$ ]] && [ "$h1" = "$h2" ] && [ "$h2" != "$h3" ] && ok "--sources-hash: $h1 in a copy too, $h3 once a header changed" \
    || bad "--sources-hash: '$h1', copy '$h2', changed '$h3'"

for a in "--llmc /nonexistent" "--frobnicate"; do  # (prepare_gpu_run.sh's arguments, checked before it builds)
    # shellcheck disable=SC2086
    bash scripts/prepare_gpu_run.sh $a >/dev/null 2>"$TMP/err"
    rc=$?
    [ "$rc" = 2 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && ok "prepare_gpu_run.sh '$a': one line, exit 2 ($(cat "$TMP/err"))" \
        || bad "prepare_gpu_run.sh '$a': exit $rc"
done

echo "2. scripts/compare_losses.py"
"$PY" - "$TMP" <<'EOF'
import json, sys
tmp = sys.argv[1]
def log(name, losses, skipped=()):  # a training log: steps from 1, a skipped step without a loss (as train_gpt logs it)
    with open(f"{tmp}/{name}.jsonl", "w") as f:
        f.write(json.dumps({"config": 1}) + "\n")
        for i, x in enumerate(losses, start=1):
            f.write(json.dumps({"step": i, "skipped": True, "loss_scale": 32768} if i in skipped else {"step": i, "loss": x}) + "\n")
log("a", [10.0] * 20)
log("b", [10.1] * 20, skipped=(3,))   # |10.0 - 10.1| / 10.1 = 0.0099, step 3 skipped
log("c", [10.0] * 19)
log("d", [10.0] * 20, skipped=(3, 4))
log("e", [10.0] * 19 + [None])      # (a loss that is not a number: JSON null)
EOF
cmp_rc() { "$PY" scripts/compare_losses.py "$@" >"$TMP/cmp.out" 2>&1; echo $?; }
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/b.jsonl" --steps 20 --limit 0.01)" = 0 ] && grep -q "^19 steps with a loss in both (skipped: a 0, b 1)" "$TMP/cmp.out" \
    && grep -q "relative 0.0099" "$TMP/cmp.out" && ok "0.0099 apart, limit 0.01, b's step 3 skipped: passes on the 19 others" \
    || { bad "0.0099 apart, limit 0.01"; cat "$TMP/cmp.out"; }
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/b.jsonl" --limit 0.009 --every)" = 1 ] && ok "0.0099 apart, limit 0.009, every step: fails" || bad "limit 0.009"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/b.jsonl" --steps 21)" = 1 ] && grep -q "not steps 1..21" "$TMP/cmp.out" && ok "--steps 21 of 20-step logs: fails" \
    || bad "--steps 21"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/d.jsonl" --max-skipped 1)" = 1 ] && grep -q "b 2: more than 1" "$TMP/cmp.out" \
    && [ "$(cmp_rc "$TMP/a.jsonl" "$TMP/d.jsonl" --max-skipped 2)" = 0 ] && ok "--max-skipped 1: 2 skipped steps fail, --max-skipped 2 passes" \
    || bad "--max-skipped"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/e.jsonl")" = 1 ] && grep -q "not a number: b step 20" "$TMP/cmp.out" && ok "a null loss: fails, named" \
    || { bad "a null loss"; cat "$TMP/cmp.out"; }
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/nothing.jsonl")" = 77 ] && ok "a missing log: 77 (SKIP)" || bad "a missing log"
[ "$(cmp_rc "$TMP/a.jsonl" "$TMP/c.jsonl")" = 1 ] && grep -q "different steps" "$TMP/cmp.out" && ok "20 steps against 19: fails" \
    || bad "different steps"

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

echo "5. a rehearsal of tier 1 on stand-ins: fake GPU binaries in a bundle, fake nvidia-smi, ncu, mpirun and llm.c"
R=$TMP/rehearsal
copy_checkout "$R"
mkdir -p "$R"/fake "$R"/build/{gpu-bf16,gpu-fp16,gpu-fp32,ref} "$R/dev/cuda/build" "$R/.llmc"
fake() {  # fake PATH BODY: an executable bash script
    printf '#!/usr/bin/env bash\n%s\n' "$2" >"$1"
    chmod +x "$1"
}
# the trainer: a log of --steps losses at 50 ms; the fast path fails at step 101 of 200, its log cut there
# (so its comparison is skipped, not failed on the cut log)
train='log="" steps=1 flash=0 fused=0
while [ $# -gt 0 ]; do
    case $1 in --log) log=$2; shift ;; --steps) steps=$2; shift ;; --attention) [ "$2" = flash ] && flash=1; shift ;;
               --fused-kernels) fused=$2; shift ;; esac
    shift
done
fail=0
[ "$flash$fused$steps" = 11200 ] && steps=100 fail=1
if [ -n "$log" ]; then for i in $(seq "$steps"); do echo "{\"step\": $i, \"loss\": 10.0, \"ms\": 50.0}"; done >"$log"; fi
[ $fail = 0 ] || { echo "error: (stand-in) the fast path fails at step 101" >&2; exit 3; }
exit 0'
for p in bf16 fp16 fp32; do fake "$R/build/gpu-$p/train_gpt" "$train"; done
fake "$R/build/gpu-bf16/test_gpt" 'echo "all passed"'
fake "$R/build/gpu-fp16/test_gpt" 'echo "FAIL: (stand-in)"; exit 1'
fake "$R/build/gpu-fp32/test_gpt" 'echo "started"; sleep "${FAKE_SLEEP:-0}"; echo "all passed"'
for f in dev/cuda/*.cu; do fake "$R/dev/cuda/build/$(basename "$f" .cu)" 'echo "version 4: 123.4 TFLOP/s"'; done
fake "$R/.llmc/train_gpt2cu" 'for i in $(seq 30); do echo "step $i/30 | loss 10.0 | norm 1.0 | lr 6e-4 | 40.00 ms | 40.0% bf16 MFU | 409600 tok/s"; done'
touch "$R/build/ref/ref_small_debug.bin"
fake "$R/fake/nvidia-smi" 'echo "name, compute_cap"; echo "Stand-in GPU, 9.0"'
fake "$R/fake/mpirun" 'echo "(stand-in mpirun: refuses)"; exit 1'
fake "$R/fake/ncu" 'while [ $# -gt 0 ]; do [ "$1" = --log-file ] && f=$2; shift; done
echo "\"ID\",\"Kernel Name\",\"Metric Name\",\"Metric Unit\",\"Metric Value\"" >"$f"
for i in 0 1 2; do echo "\"$i\",\"void flash_tc_forward_kernel<__nv_bfloat16>(int)\",\"gpu__time_duration.sum\",\"msecond\",\"1.5\"" >>"$f"; done'
(
    cd "$R" && bash scripts/check_gpu.sh --sources-hash >build/gpu-sources-hash.txt &&
    tar -czf build/gpu-bundle.tar.gz build/gpu-bf16 build/gpu-fp16 build/gpu-fp32 build/ref build/gpu-sources-hash.txt dev/cuda/build .llmc &&
    rm -rf build/gpu-bf16 build/gpu-fp16 build/gpu-fp32 build/ref build/gpu-sources-hash.txt dev/cuda/build .llmc  # (the build step unpacks them)
) || bad "the rehearsal's bundle"
rehearse() {  # rehearse OUT ARGS...: check_gpu.sh in the copy, the stand-ins first on PATH
    mkdir -p "$1"
    (cd "$R" && PATH="$R/fake:$PATH" OUT="$1" PYTHON=$PY exec bash scripts/check_gpu.sh "${@:2}")
}
rehearse "$R/a" --tier 1 >"$TMP/a.out" 2>&1
rc=$?
got=$(awk '$1 ~ /^(PASS|FAIL|SKIP|TIMEOUT)$/ { printf "%s %s\n", $1, ($2 == "-" ? $3 : $4) }' "$R/a/summary.txt" | tr '\n' ' ')
want="PASS gpu PASS build PASS test_bf16_fast FAIL test_fp16_fast PASS test_fp32_fused PASS flash_forward_bf16 PASS flash_backward_bf16 "
want+="PASS flash_forward_fp16 PASS flash_backward_fp16 PASS bf16_200 FAIL fast_bf16_200 SKIP fast_vs_default PASS benchmark PASS ncu_fast "
want+="FAIL fused_equals_unfused_fp32 "
[ "$got" = "$want" ] && [ "$rc" = 1 ] && ok "tier 1: each step's verdict as its stand-in decides (the comparison SKIP: its fast run failed), exit 1" \
    || { bad "tier 1's verdicts (exit $rc): got '$got'"; tail -20 "$TMP/a.out"; }
grep -q "the bundle's binaries (sources" "$R/build/gpu-check/build.log" && ok "the build step used the bundle" || bad "the bundle was not used"
grep -q "6 of 10 checks passed; not yet: test_fp16_fast: FAIL fast_bf16_200: FAIL fast_vs_default: SKIP fused_equals_unfused_fp32: FAIL" \
    "$R/a/summary.txt" && ok "the verdict names the 4 fast-path checks that did not pass" || bad "the verdict: $(tail -1 "$R/a/summary.txt")"
grep -q "^measured: GPT-2 124M B=16 this trainer (fast): 50.00 ms/step" "$R/build/gpu-check/benchmark.log" &&
    grep -q "^measured: GPT-2 124M B=16 llm.c: 40.00 ms/step" "$R/build/gpu-check/benchmark.log" &&
    ok "the benchmark measured the three paths and the bundle's llm.c" || { bad "the benchmark"; tail -5 "$R/build/gpu-check/benchmark.log"; }
grep -q "all kernels: 1.50 ms per step.*the step measured 50.00 ms, so 48.50 ms of it ran no kernel" "$R/build/gpu-check/ncu_fast.log" &&
    ok "the ncu breakdown took the benchmark's fast step time" || { bad "the ncu breakdown"; cat "$R/build/gpu-check/ncu_fast.log"; }
[ "$(ls "$R/a" | tr '\n' ' ')" = "gpu-check.tar.gz summary.txt " ] && ok "\$OUT: the summary and the logs' tarball" || bad "\$OUT holds: $(ls "$R/a")"
t0=$SECONDS
FAKE_SLEEP=60 rehearse "$R/b" --tier 1 --budget 10 >"$TMP/b.out" 2>&1
grep -q "^TIMEOUT .* test_fp32_fused" "$R/b/summary.txt" && grep -q "^SKIP .* flash_forward_bf16  (the budget of 10 s was spent)" "$R/b/summary.txt" &&
    [ $((SECONDS - t0)) -lt 30 ] && ok "--budget 10: the hanging step stopped at the budget (TIMEOUT), the next ones SKIP ($((SECONDS - t0)) s)" \
    || { bad "--budget 10 ($((SECONDS - t0)) s)"; cat "$R/b/summary.txt"; }
rehearse "$R/d" --tier 2 --budget 12 >"$TMP/d.out" 2>&1
grep -q "^SKIP .* benchmark_torch  (it needs about 200 s, [0-9]* s of the budget are left)" "$R/d/summary.txt" &&
    grep -q "^PASS .* test_fp32$" "$R/d/summary.txt" && ok "--budget 12: torch.compile's benchmark (MIN=200) not started, the quick steps after it run" \
    || { bad "MIN"; cat "$R/d/summary.txt"; }
mkdir -p "$R/c"
(cd "$R" && PATH="$R/fake:$PATH" OUT="$R/c" PYTHON=$PY FAKE_SLEEP=60 exec bash scripts/check_gpu.sh --tier 1) >"$TMP/c.out" 2>&1 &
pid=$!  # (check_gpu.sh's own: the subshell became it)
for _ in $(seq 200); do grep -q "^started" "$R/c/current.log" 2>/dev/null && break; sleep 0.1; done  # (the step is under way)
t0=$SECONDS
kill -TERM "$pid"
wait "$pid"
rc=$?
grep -q "^STOPPED test_fp32_fused (from .*) from outside" "$R/c/summary.txt" && grep -q "^started" "$R/c/current.log" && [ "$rc" = 143 ] &&
    [ $((SECONDS - t0)) -lt 5 ] && ok "stopped from outside during a step: at once, the summary names the step, its output so far in \$OUT/current.log" \
    || { bad "stopped from outside (exit $rc, $((SECONDS - t0)) s)"; cat "$R/c/summary.txt"; }

[ "$fails" = 0 ] && echo "gpu_scripts: all passed" || { echo "gpu_scripts: $fails failed"; exit 1; }
