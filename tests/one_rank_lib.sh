#!/usr/bin/env bash
# one_rank_lib.sh: the helpers of the one-rank suites of bad input and checkpoints (cli.sh, checkpoints.sh).
# Source it after setting BIN; it checks the trainer and the reference model, makes the temporary folder
# $TMP (removed on exit) and counts failures in $fails.
#   TINY, GOOD         a small model and a good token file's flags, so each case changes exactly one thing
#                      (the caller writes $TMP/good.bin)
#   expect_error NAME PATTERN ARGS...   the trainer exits 1 with one stderr line "error: ...PATTERN"
#   check NAME CONDITION...             a shell condition that must hold
#   cpu_target                          true when $BIN is the CPU target (its --help says so)
PY=${PYTHON:-/usr/bin/python3}
cpu_target() { [[ "$("$BIN" --help)" == *"target CPU"* ]]; }
REF=build/ref/ref_small_model.bin
[ -x "$BIN" ] || { echo "no trainer at $BIN"; exit 1; }
[ -f "$REF" ] || { echo "no reference model at $REF (run scripts/gpt2_reference.py first)"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
TINY=(--layers 1 --channels 16 --heads 2 --vocab 512 --max-seq-len 16 --batch-size 2 --seq-len 8 --steps 2
      --val-every 0 --sample-every 0)
GOOD=(--train-data "$TMP/good.bin" --val-data "$TMP/good.bin" --tokenizer "")

expect_error() {
    local name=$1 pattern=$2
    shift 2
    timeout 60 "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    local lines
    lines=$(grep -c . "$TMP/err")
    if [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && grep -q "^error: .*$pattern" "$TMP/err"; then
        printf '  ok    %-28s %s\n' "$name" "$(cat "$TMP/err")"
    else
        printf '  FAIL  %-28s exit %d (want 1), %d stderr lines (want 1), pattern "%s"\n' "$name" $rc "$lines" "$pattern"
        sed 's/^/        /' "$TMP/err" | head -5
        fails=$((fails + 1))
    fi
}

check() {
    local name=$1
    shift
    if "$@"; then printf '  ok    %s\n' "$name"; else printf '  FAIL  %s\n' "$name"; fails=$((fails + 1)); fi
}
