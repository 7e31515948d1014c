#!/usr/bin/env bash
# lib.sh: the helpers of the suites that run ranks under mpirun, shared by data_parallel, zero, faults,
# signals, rank_agreement, launch, staging, tensor_parallel, pipeline_parallel, loss_scale, nccl_emulated,
# memory_plan_emulated and kernel_report_emulated.sh. Source it after setting BIN; it makes the temporary
# folder $TMP (removed on exit) and counts failures in $fails.
#   make_tokens FILE [SEED]  a token file of 40000 random ids below 512 (seed 3 unless given)
#   use_small_run          the small 2-layer run most suites use: $TMP/tokens.bin and COMMON
#   dp_equivalence B ZERO...  dp 2-4 x grad accumulation 1-2 at each ZeRO stage against one rank
#   run NP ARGS...         the trainer on NP ranks with ${COMMON[@]} ARGS (output in $TMP/run.out)
#   compare NAME LOG_A MODEL_A LOG_B MODEL_B [FIRST_STEP]
#                          every loss (from FIRST_STEP) to 1e-5 relative and the final parameters to
#                          1e-5 relative norm
#   expect_mpi_error NAME PATTERN NP ARGS...   a bad configuration ends every rank with PATTERN
#   children_of PID        the child processes of PID
#   check_title NAME TRACE.json RUN.out TITLE HINT LEGEND
#                          a --trace run's title, warning and hint (in the trace and the run's output) and
#                          plot_trace.py's legend
# Every run uses the MPI engine's strict mode (LLMC_COMM_STRICT=1, llmc/comm.h): sends and collectives
# read their buffers only at the join, as NCCL may, so a buffer reused before its communication was
# waited for gives wrong losses here rather than only on GPUs.
PY=${PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export LLMC_COMM_STRICT=${LLMC_COMM_STRICT:-1}
MPIRUN=(mpirun --oversubscribe --bind-to none)
command -v mpirun >/dev/null || { echo "mpirun not found (Debian package openmpi-bin)"; exit 1; }
fails=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

run() {
    local np=$1
    shift
    timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" "${COMMON[@]}" "$@" >"$TMP/run.out" 2>&1 \
        || { echo "  FAIL  $np ranks: $*"; tail -5 "$TMP/run.out"; fails=$((fails + 1)); }
}

make_tokens() {  # FILE [SEED]
    mkdir -p "$(dirname "$1")"
    "$PY" - "$1" "${2:-3}" <<'PYEOF'
import random, struct, sys
random.seed(int(sys.argv[2]))
ids = [random.randrange(512) for _ in range(40000)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *([20240520, 1, len(ids)] + [0] * 253)))
    f.write(struct.pack("<%dH" % len(ids), *ids))
PYEOF
}

# The small run of the suites split from the data-parallel tests (data_parallel, zero, faults, signals,
# rank_agreement, launch, staging): token file $TMP/tokens.bin, and COMMON: 2 layers, 10 shuffled steps
use_small_run() {
    make_tokens "$TMP/tokens.bin"
    COMMON=(--layers 2 --channels 32 --heads 4 --vocab 1000 --max-seq-len 16 --seq-len 16 --steps 10 --lr 1e-3
            --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)
}

# dp_equivalence B ZERO...: dp 2, 3, 4 ranks of B sequences x grad accumulation 1, 2 at each ZeRO stage
# given, against the single-rank run of the same global batch (compare's tolerances)
dp_equivalence() {
    local B=$1 D A Z
    shift
    for D in 2 3 4; do
        for A in 1 2; do
            "$BIN" "${COMMON[@]}" --batch-size $((D * B)) --grad-accum $A --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null \
                || { echo "  FAIL  single-rank reference D=$D A=$A"; fails=$((fails + 1)); continue; }
            for Z in "$@"; do
                if timeout 120 "${MPIRUN[@]}" -np $D "$BIN" "${COMMON[@]}" --batch-size "$B" --grad-accum $A --zero "$Z" \
                    --log "$TMP/dp.jsonl" --save-model "$TMP/dp.bin" >"$TMP/dp.out" 2>&1; then
                    compare "dp=$D zero=$Z grad_accum=$A" "$TMP/dp.jsonl" "$TMP/dp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
                else
                    echo "  FAIL  dp=$D zero=$Z grad_accum=$A did not run:"; tail -5 "$TMP/dp.out"; fails=$((fails + 1))
                fi
            done
        done
    done
}

# whether $BIN is the GPU target (its --help names the target): some checks hold on the CPU target only
gpu_target() { [[ "$("$BIN" --help)" == *"target GPU"* ]]; }

compare() {
    if "$PY" - "$@" <<'PYEOF'
import json, sys
import numpy as np
name, la, pa, lb, pb = sys.argv[1:6]
first = int(sys.argv[6]) if len(sys.argv) > 6 else 1
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(la), losses(lb)
steps = [s for s in sorted(b) if s >= first]
assert steps and all(s in a for s in steps), "missing steps"
loss_err = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
x, y = np.fromfile(pa, "<f4", offset=1024), np.fromfile(pb, "<f4", offset=1024)
param_err = float(np.linalg.norm(x - y) / np.linalg.norm(y))
ok = loss_err <= 1e-5 and param_err <= 1e-5
print(f"  {'ok  ' if ok else 'FAIL'}  {name:34s} losses {loss_err:.2e}, params {param_err:.2e} (tolerance 1e-5)")
sys.exit(0 if ok else 1)
PYEOF
    then :; else fails=$((fails + 1)); fi
}

expect_mpi_error() {
    local name=$1 pattern=$2 np=$3
    shift 3
    timeout 60 "${MPIRUN[@]}" -np "$np" "$@" >"$TMP/bad.out" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^error: .*$pattern" "$TMP/bad.out"; then
        echo "  ok    $name: $(grep -m1 '^error:' "$TMP/bad.out")"
    else
        echo "  FAIL  $name: exit $rc"; tail -3 "$TMP/bad.out"; fails=$((fails + 1))
    fi
}

children_of() {  # PID: its child processes, read from /proc (procps' pgrep may be missing on a fresh machine)
    cat /proc/"$1"/task/*/children 2>/dev/null | tr ' ' '\n' | grep .
}

# The trace's run record and the run's last lines (llmc/run/trace.h), and plot_trace.py --describe: the
# title names the techniques in use (TITLE, a Python regex); a warning, one line in the output and a note
# in the record, exactly when the ranks (one thread each: OMP_NUM_THREADS above) outnumber the machine's
# cores (all of them on this machine); a hint naming --pp-split exactly when HINT is 1 (0: never; -:
# either, as stages of about equal work may come out either way on a busy machine); --describe prints that
# title and those notes, and a legend with each entry of LEGEND (separated by ";"; "!entry": without it).
check_title() {  # NAME TRACE.json RUN.out TITLE HINT(1|0|-) LEGEND
    "$PY" - "$@" "$(dirname "${BASH_SOURCE[0]}")/../scripts/plot_trace.py" <<'PYEOF'
import json, os, re, subprocess, sys
name, path, out_path, want, hint, legend, plot = sys.argv[1:8]
trace = json.load(open(path, encoding="utf-8"))["traceEvents"]
run = next((e["args"] for e in trace if e.get("name") == "run"), {})
out = open(out_path, encoding="utf-8", errors="replace").read().splitlines()
ranks, cores = len({e["pid"] for e in trace if e.get("ph") == "X"}), os.sysconf("SC_NPROCESSORS_ONLN")
title, notes, bad = run.get("title", ""), run.get("notes", []), []
if not re.fullmatch(want, title): bad.append(f"title {title!r}, want {want!r}")
setup = title.split(" · bubble")[0]
if not any(re.fullmatch(re.escape(f"wrote trace {path}: {setup}") + r"(; pipeline bubble: .*)?", l) for l in out):
    bad.append(f"no line 'wrote trace {path}: {setup}'")
warned = [l for l in out if re.match(r"warning: \d+ ranks? × \d+ threads? share \d+ cores? on this machine", l)]
if len(warned) != (ranks > cores) or [n for n in notes if n.startswith("warning: ")] != warned:
    bad.append(f"{ranks} ranks on {cores} cores: warning lines {warned}, notes {notes}")
hinted = [l for l in out if l.startswith("hint: ") and "--pp-split" in l]
if (hint != "-" and len(hinted) != int(hint)) or [n for n in notes if n.startswith("hint: ")] != hinted:
    bad.append(f"hint lines {hinted} (want {hint}), notes {notes}")
described = subprocess.run([sys.executable, plot, path, "--describe"], capture_output=True, text=True)
described = described.stdout.splitlines()
if described[:1 + len(notes)] != [f"title: {title}"] + [f"note: {n}" for n in notes]:
    bad.append(f"--describe printed {described}")
entries = next((l[len("legend: "):].split(", ") for l in described if l.startswith("legend: ")), [])
if [e for e in legend.split(";") if e and ((e[1:] in entries) if e.startswith("!") else (e not in entries))]:
    bad.append(f"legend {entries}, want {legend}")
print(f"  {'ok  ' if not bad else 'FAIL'}  trace {name}: title '{title}'" + (f", {len(notes)} note(s)" if notes else "")
      + "".join("\n        " + b for b in bad))
sys.exit(1 if bad else 0)
PYEOF
}
