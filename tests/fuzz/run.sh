#!/usr/bin/env bash
# run.sh: builds the fuzz harnesses, makes their seed corpus, replays every kept regression input, then
# fuzzes each reader for a short fixed time (CI runs this from tests/run_all.sh). See README.md.
# usage: tests/fuzz/run.sh [TRAINER]     (default build/cpu/train_gpt, used to make the seeds)
#        FUZZ_SECONDS=N            seconds of fuzzing per reader [12]
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-build/cpu/train_gpt}
SECONDS_EACH=${FUZZ_SECONDS:-12}
READERS=(model tokens tokenizer state)
# -timeout: an input that takes 5 s is a hang; -malloc_limit_mb: no input of a few KB justifies a
# 256 MB allocation, so a forged size that asks for one is a finding, not just slowness
OPTS=(-timeout=5 -malloc_limit_mb=256 -print_final_stats=1)

make -s -C tests/fuzz -j2 || exit 1
build/fuzz/fuzz_selftest >build/fuzz/selftest.log 2>&1 || {
    echo "  FAIL  the harness's own check (fuzz_try):"; sed 's/^/        /' build/fuzz/selftest.log | tail -20; exit 1; }
echo "  ok    the harness's own check: $(tail -1 build/fuzz/selftest.log)"
bash tests/fuzz/make_seeds.sh "$BIN" build/fuzz/seeds >/dev/null || { echo "  FAIL  making the seed corpus"; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p build/fuzz/artifacts
fails=0
for r in "${READERS[@]}"; do
    regressions=(tests/fuzz/regressions/$r/*)
    [ -e "${regressions[0]}" ] || regressions=()
    # every kept input once (a crash there is a regression), then the seeds plus fuzzing
    if [ ${#regressions[@]} -gt 0 ] && ! timeout 120 build/fuzz/fuzz_$r "${OPTS[@]}" "${regressions[@]}" >"$WORK/$r.replay" 2>&1; then
        echo "  FAIL  $r: a kept regression input fails again:"
        grep -E "ERROR|runtime error|Running" "$WORK/$r.replay" | tail -5 | sed 's/^/        /'
        fails=$((fails + 1))
        continue
    fi
    mkdir -p "$WORK/corpus_$r"
    if timeout $((SECONDS_EACH + 60)) build/fuzz/fuzz_$r "${OPTS[@]}" -max_total_time="$SECONDS_EACH" \
        -artifact_prefix=build/fuzz/artifacts/${r}_ "$WORK/corpus_$r" build/fuzz/seeds/$r >"$WORK/$r.log" 2>&1; then
        printf '  ok    %-10s %d regression inputs, %s executions in %s s\n' "$r" ${#regressions[@]} \
            "$(grep -o 'stat::number_of_executed_units: [0-9]*' "$WORK/$r.log" | grep -o '[0-9]*$')" "$SECONDS_EACH"
    else
        echo "  FAIL  $r: the fuzzer found an input that crashes (kept in build/fuzz/artifacts/):"
        grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$WORK/$r.log" | tail -5 | sed 's/^/        /'
        fails=$((fails + 1))
    fi
done
[ $fails -eq 0 ] || { echo "$fails fuzz harness(es) failed"; exit 1; }
