#!/usr/bin/env bash
# pipeline_parallel.sh: pipeline parallelism on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: pp in {2,3,4} x micro-batches M in {1,4,7} x schedule in {gpipe, 1f1b}, with L=5
#      layers (divisible by none of them): 10 steps equal the single-rank run of the same batch (every
#      loss to 1e-5 relative, final parameters to 1e-5 relative norm); also an explicit --pp-split and
#      rematerialization (in the MPI engine's strict mode, lib.sh, a forward output sent
#      from the rematerialized work set without waiting for the send gives wrong losses)
#   2. 3D: dp x tp x pp = 2 x 2 x 2 (8 ranks) with ZeRO 0 and 1 equals the single-rank run; resuming
#      that grid from a checkpoint is bit-exact; so is --fused-kernels 1 (device-side losses) against 0
#   3. the trace: a Chrome trace with every rank's forward, backward, send and receive spans on one
#      clock (every message ends on its receiver after it began on its sender), communication on a lane
#      of its own (with dp x tp x pp: DP reductions, TP f/g), and the bubble printed
#   4. --print-schedule: the GPipe timeline equals the diagram in llmc/pipeline.h, a 1F1B case equals
#      the messages worked out by hand, every printed send has its receive, the bubble line gives
#      3(P-1) idle slots of 3(M+P-1)
#   5. bad configurations: more stages than layers, zero micro-batches, a batch that does not split into
#      the micro-batches, ZeRO-2 with pipelining
# usage: tests/pipeline_parallel.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 5 --channels 32 --heads 4 --vocab 512 --max-seq-len 16 --seq-len 16 --steps 10 --lr 1e-3
        --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)
b=2  # sequences per micro-batch


echo "1. equivalence with the single-rank run"
for M in 1 4 7; do
    "$BIN" "${COMMON[@]}" --batch-size $((b * M)) --micro-batches $M --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
    for P in 2 3 4; do
        for S in gpipe 1f1b; do
            run $P --pp $P --schedule $S --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
            compare "pp=$P M=$M $S" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        done
    done
    if [ $M -eq 4 ]; then
        run 2 --pp 2 --pp-split 1,4 --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
        compare "pp=2 M=4 --pp-split 1,4" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        for S in gpipe 1f1b; do
            run 3 --pp 3 --schedule $S --pp-rematerialize 1 --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
            compare "pp=3 M=4 $S rematerialized" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        done
    fi
done

echo "2. dp x tp x pp = 2 x 2 x 2"
"$BIN" "${COMMON[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/ref3d.jsonl" --save-model "$TMP/ref3d.bin" >/dev/null
for Z in 0 1; do
    run 8 --dp 2 --tp 2 --pp 2 --zero $Z --schedule 1f1b --batch-size 4 --micro-batches 4 --log "$TMP/3d.jsonl" --save-model "$TMP/3d.bin"
    compare "2x2x2, ZeRO-$Z" "$TMP/3d.jsonl" "$TMP/3d.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin"
done
# --fused-kernels 1 keeps each micro-step's mean loss on the device and fetches the step's losses in one
# copy at its end (1F1B: the last stage interleaves forwards and backwards); the CPU target must give the
# same bits as the run above, the GPU target (whose fused kernels sum in another order) the same run to
# the suite's tolerance
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --schedule 1f1b --batch-size 4 --micro-batches 4 --fused-kernels 1 --log "$TMP/3df.jsonl" --save-model "$TMP/3df.bin"
if gpu_target; then
    compare "2x2x2 ZeRO-1 1f1b, --fused-kernels 1 (GPU)" "$TMP/3df.jsonl" "$TMP/3df.bin" "$TMP/3d.jsonl" "$TMP/3d.bin"
elif cmp -s "$TMP/3d.bin" "$TMP/3df.bin" && [ "$(grep -o '"loss": [^,]*' "$TMP/3d.jsonl")" = "$(grep -o '"loss": [^,]*' "$TMP/3df.jsonl")" ] &&
    [ "$(grep -c '"loss"' "$TMP/3df.jsonl")" -eq 10 ]; then
    echo "  ok    2x2x2 ZeRO-1 1f1b with --fused-kernels 1: the same 10 losses and final model, bit for bit"
else
    echo "  FAIL  2x2x2 ZeRO-1 1f1b with --fused-kernels 1 differs from the run without"; fails=$((fails + 1))
fi
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --stop-after 5 --checkpoint-dir "$TMP/ck"
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --resume "$TMP/ck" --save-model "$TMP/3dr.bin"
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --save-model "$TMP/3ds.bin"
if cmp -s "$TMP/3ds.bin" "$TMP/3dr.bin"; then echo "  ok    2x2x2 ZeRO-1 resumed at step 5: final model byte-identical"
else echo "  FAIL  2x2x2 ZeRO-1 resumed at step 5: final model differs"; fails=$((fails + 1)); fi

echo "3. trace"
# Each rank's spans are on its own clock: they must share one origin (llmc/trace.h), or a receive seems
# to end before its send began. Every message, "act m" (forward) or "grad m" (backward), the k-th of its
# name in the traced steps, must end on the receiving stage after it started on the sending stage, in
# both directions (so a shift of either rank's clock is caught). Lanes: compute (tid 0), communication
# (tid 1); a 2x2x2 trace has the data-parallel reductions and the tensor-parallel f/g sums on the latter.
check_trace() {  # NAME TRACE.json PP-ONLY(1|0) STRIDE (ranks from one stage to the next: dp x tp)
    "$PY" - "$@" <<'PYEOF'
import collections, json, re, sys
name, path, pp_only, stride = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
trace = json.load(open(path))["traceEvents"]
events = [e for e in trace if e.get("ph") == "X"]
err = {e["pid"]: e["args"]["origin_error_us"] for e in trace if e.get("name") == "clock"}
bad = [] if len(err) == len({e["pid"] for e in events}) else ["no clock alignment error recorded"]
cats = {(e["pid"], e["cat"]) for e in events}
need = {(p, c) for p in (0, 1) for c in ("forward", "backward", "optimizer")}
need |= {(0, "send"), (1, "recv")} if pp_only else {(p, c) for p in range(8) for c in ("tp", "allreduce")}
if need - cats: bad.append(f"missing {sorted(need - cats)}")
lanes = {e["cat"]: e["tid"] for e in events}
if any((c in ("forward", "backward", "optimizer")) != (t == 0) for c, t in lanes.items()): bad.append(f"lanes {lanes}")
sends, recvs = collections.defaultdict(list), collections.defaultdict(list)
for e in sorted(events, key=lambda e: e["ts"]):
    for kind, what in re.findall(r"(send|recv) ((?:act|grad) \d+)", e["name"]):
        (sends if kind == "send" else recvs)[(e["pid"], what)].append(e)
pairs = 0
for (pid, what), rs in recvs.items():
    ss = sends[(pid - stride if what.startswith("act") else pid + stride, what)]  # the previous / next stage
    if len(ss) != len(rs): bad.append(f"rank {pid}: {len(rs)} receives of '{what}', {len(ss)} sends"); continue
    for s, r in zip(ss, rs):
        pairs += 1
        tol = err[pid] + err[s["pid"]]  # the bound on each rank's origin that the trace states
        if r["ts"] + r["dur"] + tol < s["ts"]:
            bad.append(f"'{what}' received by rank {pid} at {r['ts'] + r['dur']:.1f} us, sent by rank {s['pid']} from {s['ts']:.1f} us "
                       f"(clocks aligned to {tol:.1f} us)")
if pairs == 0: bad.append("no messages")
print(f"  {'ok  ' if not bad else 'FAIL'}  trace {name}: {len(events)} spans on {len({e['pid'] for e in events})} ranks, "
      f"{pairs} messages" + ("" if bad else f", each received after it was sent (clocks aligned to {max(err.values(), default=0):.1f} us)") + ("".join("\n        " + b for b in bad[:5]) if bad else ""))
sys.exit(1 if bad else 0)
PYEOF
}
# (--fault-clock-skew: rank r's clock reads r x S seconds ahead, as another node's might; aligned, the
# trace must not show it, whichever way it goes)
for c in gpipe:0 1f1b:-2.5; do
    IFS=: read -r S skew <<< "$c"
    run 2 --pp 2 --schedule $S --batch-size 8 --micro-batches 4 --steps 3 --trace "$TMP/trace_$S.json" --fault-clock-skew $skew
    grep -h "pipeline bubble" "$TMP/run.out" | sed 's/^/        /'
    check_trace "pp=2 $S, clock skew $skew s" "$TMP/trace_$S.json" 1 1 || fails=$((fails + 1))
done
run 8 --dp 2 --tp 2 --pp 2 --schedule 1f1b --batch-size 4 --micro-batches 4 --steps 3 --trace "$TMP/trace3d.json" --fault-clock-skew 0.25
check_trace "2x2x2 1f1b, clock skew 0.25 s per rank" "$TMP/trace3d.json" 0 4 || fails=$((fails + 1))
cp "$TMP/trace_gpipe.json" "$TMP/trace.json"
if "$PY" -c "import matplotlib" 2>/dev/null; then
    if "$PY" "$(dirname "$0")/../scripts/plot_trace.py" "$TMP/trace.json" -o "$TMP/trace.png" >/dev/null && [ -s "$TMP/trace.png" ]; then echo "  ok    plot_trace.py rendered a PNG"
    else echo "  FAIL  plot_trace.py"; fails=$((fails + 1)); fi
fi

echo "4. --print-schedule"
# the GPipe timeline for P=2, M=4 equals the hand-drawn one in llmc/pipeline.h's header (where a
# backward's second slot is drawn '.': compare with '==' as '.', spaces squeezed, trailing idle dropped)
norm() { sed -e 's/==/./g' -e 's/  */ /g' -e 's/\( \.\)* *$//'; }
"$BIN" --print-schedule --pp 2 --batch-size 4 --micro-batches 4 >"$TMP/sched.out" 2>&1
got=$(grep '^  stage  [01] |' "$TMP/sched.out" | sed 's/^  stage  \([01]\) |/stage \1/' | norm)
want=$(sed -n 's/^ \*   \(stage [01]\)   \(.*\)/\1 \2/p' llmc/pipeline.h | sed 's/ *(GPipe.*//' | norm)
if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "  ok    GPipe P=2 M=4 timeline equals the diagram in llmc/pipeline.h"
else echo "  FAIL  GPipe P=2 M=4 timeline:"; echo "$got"; echo "  want:"; echo "$want"; fails=$((fails + 1)); fi
# the timeline is a grid: slot t of every stage starts at the same column, so in GPipe micro-batch m's
# forward on stage s sits in slot s + m (M=12 has two-digit ids, M=101 three-digit ones)
for M in 12 101; do
    "$BIN" --print-schedule --pp 4 --batch-size $M --micro-batches $M >"$TMP/sched.out" 2>&1
    if "$PY" - "$TMP/sched.out" $M <<'PYEOF'
import re, sys
M, rows = int(sys.argv[2]), [l.rstrip("\n") for l in open(sys.argv[1]) if re.match(r"  stage +\d+ \|", l)]
w = 4 if M <= 100 else 5
ok = len(rows) == 4
for s, row in enumerate(rows):
    cells = row.split("|", 1)[1]
    ok &= len(cells) % w == 0
    slots = [cells[i:i + w].strip() for i in range(0, len(cells), w)]
    ok &= all(slots[s + m] == f"F{m}" for m in range(M))
sys.exit(0 if ok else 1)
PYEOF
    then echo "  ok    GPipe P=4 M=$M timeline: every slot in the same columns on every stage"
    else echo "  FAIL  GPipe P=4 M=$M timeline columns:"; head -6 "$TMP/sched.out"; fails=$((fails + 1)); fi
done
# 1F1B, P=2, M=2: the messages as pipe_exchange sends them, worked out by hand from its rules
"$BIN" --print-schedule --pp 2 --batch-size 2 --micro-batches 2 --schedule 1f1b >"$TMP/sched.out" 2>&1
if grep -qF "stage  0 (2 activation slots) | F0 | send a0>1 | F1 | sendrecv a1>1 g0<1 | B0 | recv g1<1 | B1 |" "$TMP/sched.out" \
    && grep -qF "stage  1 (1 activation slot) | recv a0<0 | F0 | B0 | sendrecv g0>0 a1<0 | F1 | B1 | send g1>0 |" "$TMP/sched.out"; then
    echo "  ok    1F1B P=2 M=2 actions and messages as worked out by hand"
else echo "  FAIL  1F1B P=2 M=2 actions and messages:"; cat "$TMP/sched.out"; fails=$((fails + 1)); fi
# every message printed as sent from stage s to k is printed as received by k from s, once, for P 2..4,
# M 1..7, both schedules
before=$fails
for S in gpipe 1f1b; do for P in 2 3 4; do for M in 1 4 7; do
    "$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M --schedule $S >"$TMP/sched.out" 2>&1 || echo "exit $?" >>"$TMP/sched.out"
    "$PY" - "$TMP/sched.out" <<'PYEOF' || { echo "  FAIL  --print-schedule $S P=$P M=$M: unpaired messages"; fails=$((fails + 1)); }
import re, sys, collections
sent, recv = collections.Counter(), collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"  stage +(\d+) \(", line)
    if not m: continue
    s = int(m.group(1))
    for kind, micro, op, peer in re.findall(r"([ag])(\d+)([<>])(\d+)", line):
        (sent if op == ">" else recv)[(kind, micro, s, int(peer)) if op == ">" else (kind, micro, int(peer), s)] += 1
sys.exit(0 if sent and sent == recv and max(sent.values()) == 1 else 1)
PYEOF
done; done; done
[ $fails -eq $before ] && echo "  ok    every printed send has its receive: gpipe and 1f1b, P 2..4, M 1, 4, 7"

# the closing bubble line: with a forward one slot and a backward two, both schedules leave every
# stage idle 3(P-1) of 3(M+P-1) slots
for c in gpipe:2:4 1f1b:4:8 gpipe:3:1 1f1b:3:7; do
    IFS=: read -r S P M <<< "$c"
    got=$("$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M --schedule $S | tail -n 1)
    pct=$(awk -v p="$P" -v m="$M" 'BEGIN { printf "%.1f", 100 * (p - 1) / (m + p - 1) }')
    want="bubble: every stage is idle $((3 * (P - 1))) of the step's $((3 * (M + P - 1))) slots, $pct%; (P-1)/(M+P-1) = $pct%"
    if [ "$got" = "$want" ]; then echo "  ok    $S P=$P M=$M: $got"
    else echo "  FAIL  $S P=$P M=$M: '$got', want '$want'"; fails=$((fails + 1)); fi
done

echo "5. bad configurations"
expect_mpi_error "more stages than layers" "more pipeline stages than the 5 layers" 6 "$BIN" "${COMMON[@]}" --pp 6 --batch-size 2
expect_mpi_error "zero micro-batches" "--micro-batches must be between 1" 2 "$BIN" "${COMMON[@]}" --pp 2 --micro-batches 0
expect_mpi_error "batch not divisible" "--batch-size 6 does not split into 4 micro-batches" 2 "$BIN" "${COMMON[@]}" --pp 2 --batch-size 6 --micro-batches 4
expect_mpi_error "ZeRO-2 with pipelining" "--zero 2 with --pp is not supported" 2 "$BIN" "${COMMON[@]}" --pp 2 --zero 2
expect_mpi_error "--pp-split of the wrong sum" "covers 4 layers, the model has 5" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-split 2,2
# counts beyond int: 4294967294 is -2 as an int (7 - 2 = 5 layers, once a crash), 4294967298 is 2 (2 + 3 = 5)
expect_mpi_error "--pp-split 7,4294967294" "add up to more than the model's 5 layers" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-split 7,4294967294
expect_mpi_error "--pp-split 4294967298,3" "add up to more than the model's 5 layers" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-split 4294967298,3
expect_mpi_error "--pp-split 99999999999999999999,1" "add up to more than the model's 5 layers" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-split 99999999999999999999,1
expect_mpi_error "--pp-split +2,3" "expected 2 positive layer counts" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-split +2,3

if [ $fails -ne 0 ]; then echo "pipeline_parallel: $fails FAILED"; exit 1; fi
echo "pipeline_parallel: all passed"
