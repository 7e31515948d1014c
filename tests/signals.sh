#!/usr/bin/env bash
# signals.sh: stopping cleanly on a signal (llmc/run/stop_signal.h), on the CPU target.
#   SIGTERM sent to one rank of two (dp 2, ZeRO-1, under mpirun; a SIGUSR1 to the other right after it)
#   after step 3 (the run waits there for them: --fault-wait-signal 3), and SIGINT twice to a single
#   rank, stop the run after the step in progress with a checkpoint and exit code 3; the resumed run's
#   losses and final model are bit-identical to an uninterrupted run's
# usage: tests/signals.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)

echo "a signal stops the run with a checkpoint; the resumed run equals an uninterrupted one bit for bit"
# the process of world rank R among the descendants of PID (timeout -> mpirun -> ranks, or timeout -> trainer)
rank_pid() {
    local p
    for p in $(children_of "$1"); do
        if [ "$2" = single ] || tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$p"; return; fi
        rank_pid "$p" "$2"
    done
}
# signal_case NAME NP "SIGNAL:RANK ..." ARGS...: an uninterrupted run of SIG_STEPS steps, then one that
# gets the signals (in order, at once) after step 3, then its resume; all with ARGS. The signalled run
# waits after step 3 until a signal has come (--fault-wait-signal 3), so the test does not race it.
SIG_STEPS=20
signal_case() {
    local name=$1 np=$2 signals=$3 launch=("$BIN") i sr p
    shift 3
    [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np" "$BIN")
    local args=("${COMMON[@]}" --steps $SIG_STEPS "$@")
    rm -rf "$TMP/sig_ck" "$TMP/sig_r.jsonl"
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_u.jsonl" --save-model "$TMP/sig_u.bin" >"$TMP/sig.out" 2>&1 \
        || { echo "  FAIL  $name: the uninterrupted run did not complete (exit $?)"; tail -3 "$TMP/sig.out"; fails=$((fails + 1)); return; }
    # (sig.out is removed first: the background job truncates it only when it starts, and the loop below
    # must not find the uninterrupted run's "step 3" in it and signal a run that is not yet listening)
    rm -f "$TMP/sig.out"
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_r.jsonl" --checkpoint-dir "$TMP/sig_ck" --fault-wait-signal 3 >"$TMP/sig.out" 2>&1 &
    local job=$!
    for i in $(seq 600); do grep -q "^step     3/" "$TMP/sig.out" || ! kill -0 $job 2>/dev/null && break; sleep 0.1; done
    for sr in $signals; do
        p=$(rank_pid $job "${sr#*:}")
        [ -n "$p" ] && kill -"${sr%:*}" "$p" 2>/dev/null  # (a second signal may come after the run ended)
    done
    wait $job
    local rc=$? stopped
    stopped=$(sed -n 's/^stopped by SIG[A-Z0-9]* after step \([0-9]*\):.*/\1/p' "$TMP/sig.out")
    if [ $rc -eq 3 ] && [ "$stopped" = 3 ] && [ -f "$TMP/sig_ck/model_$(printf %08d "$stopped").bin" ]; then
        echo "  ok    $name: exit 3, $(grep '^stopped by' "$TMP/sig.out")"
    else
        echo "  FAIL  $name: exit $rc (want 3), stopped after step '$stopped' (want 3)"; tail -5 "$TMP/sig.out"; fails=$((fails + 1)); return
    fi
    timeout 120 "${launch[@]}" "${args[@]}" --log "$TMP/sig_r.jsonl" --resume "$TMP/sig_ck" --save-model "$TMP/sig_r.bin" >"$TMP/sig.out" 2>&1 \
        || { echo "  FAIL  $name: the resume did not run"; tail -5 "$TMP/sig.out"; fails=$((fails + 1)); return; }
    if cmp -s "$TMP/sig_u.bin" "$TMP/sig_r.bin" && "$PY" - "$TMP/sig_u.jsonl" "$TMP/sig_r.jsonl" $SIG_STEPS <<'PYEOF'
import json, sys
u, r = ([(x["step"], x["loss"]) for x in map(json.loads, open(p)) if "loss" in x] for p in sys.argv[1:3])
sys.exit(0 if u == r and len(u) == int(sys.argv[3]) else 1)  # every loss, bit for bit (printed with 9 significant digits: float32 exactly)
PYEOF
    then echo "  ok    $name: resumed == uninterrupted ($SIG_STEPS losses and the final model, bit for bit)"
    else echo "  FAIL  $name: resumed run differs from the uninterrupted one"; fails=$((fails + 1)); fi
}
signal_case "SIGTERM to rank 1 of 2 (ZeRO-1)" 2 "TERM:1 USR1:0" --batch-size 4 --zero 1
signal_case "SIGINT twice, one rank" 1 "INT:single INT:single" --batch-size 8

if [ $fails -ne 0 ]; then echo "signals: $fails FAILED"; exit 1; fi
echo "signals: all passed"
