#!/usr/bin/env bash
# pipeline_parallel.sh: pipeline parallelism on the CPU target under mpirun, against single-rank runs.
#   1. equivalence: pp in {2,3,4} x micro-batches M in {1,4,7} x schedule in {gpipe, 1f1b, zb-h1 (M >= P)},
#      with L=5 layers (divisible by none of them): 10 steps equal the single-rank run of the same batch
#      (every loss to 1e-5 relative, final parameters to 1e-5 relative norm); also an explicit --pp-split and
#      rematerialization (in the MPI engine's strict mode, lib.sh, a forward output sent
#      from the rematerialized work set without waiting for the send gives wrong losses); the
#      interleaved schedule with pp in {2,3,4} x V in {2,3} x M in {P, 2P} on L=12 layers (cut into P*V
#      chunks, unevenly for P*V = 8, 9), with --pp-split of the chunks, recomputation, loss scaling,
#      validation and sampling; ZB-H1 with --pp-split, loss scaling, validation and sampling
#   2. 3D: dp x tp x pp = 2 x 2 x 2 (8 ranks) with ZeRO 0 and 1 equals the single-rank run, with 1F1B,
#      interleaved and ZB-H1 (whose W's reduce each layer's bucket); resuming that grid from a checkpoint is bit-exact, and an interleaved
#      checkpoint resumes on one rank and on 3 stages of 1F1B; --fused-kernels 1 (device-side losses)
#      gives the bits of 0 (1F1B, interleaved, ZB-H1)
#   3. the trace: a Chrome trace with every rank's forward, backward, send and receive spans on one
#      clock (every message ends on its receiver after it began on its sender), communication on a lane
#      of its own (with dp x tp x pp: DP reductions, TP f/g), and the bubble printed (1F1B, GPipe,
#      interleaved, whose messages go round the ring of stages; ZB-H1, whose B and W are spans of their own);
#      the title naming dp, tp, pp and the schedule, the warning when ranks outnumber cores, the --pp-split
#      hint for a stage given most layers, interleaved spans named with their chunk; plot_trace.py's
#      labels ("RS 3", "AG 1", "send act 2", "F 3.1") and legend (reduce-scatter and all-gather apart)
#   4. --print-schedule: the GPipe, interleaved and ZB-H1 timelines equal the diagrams in llmc/pipeline.h, a
#      1F1B case equals the messages worked out by hand; every stage's printed exchanges, run as
#      blocking operations (a send completes only with its receive, as NCCL's do), all complete with
#      each message received in the order it was sent (all four schedules, P 2..4, M and V); the bubble
#      line gives 3(P-1) idle slots of 3(M+P-1), of 3(VM+P-1) interleaved, and P-1 of 3M+P-1 with ZB-H1
#   5. bad configurations: more stages than layers, zero micro-batches, a batch that does not split into
#      the micro-batches, ZeRO-2 with pipelining; interleaved with M not a multiple of P, with one chunk,
#      without --pp, with --pp-rematerialize, with more chunks than layers, --virtual-stages alone; ZB-H1
#      with fewer micro-batches than stages, without --pp, with --recompute or --pp-rematerialize
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
        for S in gpipe 1f1b zb-h1; do
            [ $S = zb-h1 ] && [ $M -lt $P ] && continue  # (refused: section 5)
            run $P --pp $P --pp-schedule $S --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
            compare "pp=$P M=$M $S" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        done
    done
    if [ $M -eq 4 ]; then
        run 2 --pp 2 --pp-split 1,4 --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
        compare "pp=2 M=4 --pp-split 1,4" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        run 3 --pp 3 --pp-split 1,3,1 --pp-schedule zb-h1 --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
        compare "pp=3 M=4 zb-h1 --pp-split 1,3,1" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        # ZB-H1 runs 1F1B's products, and adds each weight gradient up over the micro-batches in the same
        # order: the same bits
        for S in 1f1b zb-h1; do run 3 --pp 3 --pp-schedule $S --batch-size $((b * M)) --micro-batches $M --save-model "$TMP/pp_$S.bin"; done
        if cmp -s "$TMP/pp_1f1b.bin" "$TMP/pp_zb-h1.bin"; then echo "  ok    pp=3 M=4: zb-h1's final model equals 1f1b's, byte for byte"
        else echo "  FAIL  pp=3 M=4: zb-h1's final model differs from 1f1b's"; fails=$((fails + 1)); fi
        for S in gpipe 1f1b; do
            run 3 --pp 3 --pp-schedule $S --pp-rematerialize 1 --batch-size $((b * M)) --micro-batches $M --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
            compare "pp=3 M=4 $S rematerialized" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        done
    fi
done

# interleaved: L=12 layers so that P*V chunks fit (P=4, V=3: one layer each); M a multiple of P
IL=(--layers 12 --val-every 0)
for P in 2 3 4; do
    for M in $P $((2 * P)); do
        "$BIN" "${COMMON[@]}" "${IL[@]}" --batch-size $((b * M)) --micro-batches $M --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
        for V in 2 3; do
            run $P --pp $P --pp-schedule interleaved --virtual-stages $V "${IL[@]}" --batch-size $((b * M)) --micro-batches $M \
                --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
            compare "interleaved pp=$P V=$V M=$M" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
        done
    done
done
# (M=4 for the rest: the last reference above is P=4, M=8)
"$BIN" "${COMMON[@]}" "${IL[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null
run 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --pp-split 1,5,2,4 "${IL[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
compare "interleaved pp=2 V=2 --pp-split 1,5,2,4" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
for R in "--recompute 2" "--recompute 3 --recompute-segment 2"; do
    # shellcheck disable=SC2086  # (R is two or four words)
    run 2 --pp 2 --pp-schedule interleaved --virtual-stages 3 $R "${IL[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
    compare "interleaved pp=2 V=3 $R" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
done
# a fixed loss scale multiplies every gradient by 1024 and the update divides it out: the same run
"$BIN" "${COMMON[@]}" "${IL[@]}" --batch-size 8 --micro-batches 4 --loss-scale 1024 --log "$TMP/refs.jsonl" --save-model "$TMP/refs.bin" >/dev/null
run 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --loss-scale 1024 "${IL[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
compare "interleaved pp=2 V=2 --loss-scale 1024" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/refs.jsonl" "$TMP/refs.bin"
run 4 --pp 4 --pp-schedule zb-h1 --loss-scale 1024 "${IL[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/pp.jsonl" --save-model "$TMP/pp.bin"
compare "zb-h1 pp=4 --loss-scale 1024" "$TMP/pp.jsonl" "$TMP/pp.bin" "$TMP/refs.jsonl" "$TMP/refs.bin"
# validation (forward only, chunk after chunk round the ring): every step's validation loss equal to 1e-5
"$BIN" "${COMMON[@]}" "${IL[@]}" --batch-size 8 --micro-batches 4 --val-data "$TMP/tokens.bin" --val-every 2 --val-batches 3 >"$TMP/val1.out"
for S in "interleaved --virtual-stages 2" zb-h1; do
    # shellcheck disable=SC2086  # (S is one or three words)
    run 4 --pp 4 --pp-schedule $S "${IL[@]}" --batch-size 8 --micro-batches 4 --val-data "$TMP/tokens.bin" --val-every 2 --val-batches 3
    if "$PY" - "$TMP/val1.out" "$TMP/run.out" "$S" <<'PYEOF'
import re, sys
a, b = ([float(x) for x in re.findall(r"step \d+: val loss ([0-9.]+)", open(p).read())] for p in sys.argv[1:3])
ok = len(a) == 6 and len(a) == len(b) and all(abs(x - y) <= 1e-5 * abs(x) + 1e-4 for x, y in zip(a, b))
print(f"  {'ok  ' if ok else 'FAIL'}  {sys.argv[3]} pp=4: {len(b)} validation losses equal the single rank's ({a[-1] if a else '-'} at the end; "
      "printed to 4 decimals, so equal to 1e-4)")
sys.exit(0 if ok else 1)
PYEOF
    then :; else fails=$((fails + 1)); fi
done

# sampling (forward only through the chunks, the last stage's last chunk drawing): the default data and
# tokenizer, the same sample as one rank's
SAMPLE=(--layers 4 --channels 32 --heads 4 --max-seq-len 64 --seq-len 64 --steps 2 --val-every 0 --sample-every 2 --sample-len 16
        --batch-size 4 --micro-batches 2 --seed 7)
"$BIN" "${SAMPLE[@]}" >"$TMP/sample1.out" 2>&1
for S in "interleaved --virtual-stages 2" zb-h1; do
    # shellcheck disable=SC2086  # (S is one or three words)
    timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" "${SAMPLE[@]}" --pp 2 --pp-schedule $S >"$TMP/sample2.out" 2>&1
    if grep -aq "^sample: " "$TMP/sample1.out" && [ "$(grep -a "^sample: " "$TMP/sample1.out")" = "$(grep -a "^sample: " "$TMP/sample2.out")" ]; then
        echo "  ok    $S pp=2: the sample equals one rank's"
    else echo "  FAIL  $S pp=2 sample:"; grep -a "^sample: \|^error" "$TMP/sample1.out" "$TMP/sample2.out"; fails=$((fails + 1)); fi
done

# fused_same NAME FUSED PLAIN: the run with --fused-kernels 1 ($TMP/FUSED.jsonl, .bin) against the same run
# without ($TMP/PLAIN.*): on the CPU target the same 10 losses and final model, bit for bit; on the GPU
# target (whose fused kernels sum in other orders) to the suite's tolerance
fused_same() {
    local name=$1 f=$TMP/$2 p=$TMP/$3
    if gpu_target; then compare "$name, --fused-kernels 1 (GPU)" "$f.jsonl" "$f.bin" "$p.jsonl" "$p.bin"
    elif cmp -s "$p.bin" "$f.bin" && [ "$(grep -o '"loss": [^,]*' "$p.jsonl")" = "$(grep -o '"loss": [^,]*' "$f.jsonl")" ] &&
        [ "$(grep -c '"loss"' "$f.jsonl")" -eq 10 ]; then
        echo "  ok    $name with --fused-kernels 1: the same 10 losses and final model, bit for bit"
    else echo "  FAIL  $name with --fused-kernels 1 differs from the run without"; fails=$((fails + 1)); fi
}

echo "2. dp x tp x pp = 2 x 2 x 2"
"$BIN" "${COMMON[@]}" --batch-size 8 --micro-batches 4 --log "$TMP/ref3d.jsonl" --save-model "$TMP/ref3d.bin" >/dev/null
for Z in 0 1; do
    run 8 --dp 2 --tp 2 --pp 2 --zero $Z --pp-schedule 1f1b --batch-size 4 --micro-batches 4 --log "$TMP/3d.jsonl" --save-model "$TMP/3d.bin"
    compare "2x2x2, ZeRO-$Z" "$TMP/3d.jsonl" "$TMP/3d.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin"
done
# interleaved (2 chunks of 2, 1 and 1 layers per stage: --pp-split 2,1,1,1 of L=5) in the 3D grid
for Z in 0 1; do
    run 8 --dp 2 --tp 2 --pp 2 --zero $Z --pp-schedule interleaved --virtual-stages 2 --pp-split 2,1,1,1 --batch-size 4 --micro-batches 4 \
        --log "$TMP/3di.jsonl" --save-model "$TMP/3di.bin"
    compare "2x2x2 interleaved V=2, ZeRO-$Z" "$TMP/3di.jsonl" "$TMP/3di.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin"
done
# ZB-H1 in the 3D grid: each W of the last micro-batch starts its layer's DP reduction; TP's f sums are in B
for Z in 0 1; do
    run 8 --dp 2 --tp 2 --pp 2 --zero $Z --pp-schedule zb-h1 --batch-size 4 --micro-batches 4 --log "$TMP/3dz.jsonl" --save-model "$TMP/3dz.bin"
    compare "2x2x2 zb-h1, ZeRO-$Z" "$TMP/3dz.jsonl" "$TMP/3dz.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin"
done
if cmp -s "$TMP/3d.bin" "$TMP/3dz.bin"; then echo "  ok    2x2x2 ZeRO-1: zb-h1's final model equals 1f1b's, byte for byte"
else echo "  FAIL  2x2x2 ZeRO-1: zb-h1's final model differs from 1f1b's"; fails=$((fails + 1)); fi
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule zb-h1 --batch-size 4 --micro-batches 4 --fused-kernels 1 --log "$TMP/3dzf.jsonl" --save-model "$TMP/3dzf.bin"
fused_same "2x2x2 zb-h1 ZeRO-1" 3dzf 3dz
# --fused-kernels 1: the last stage's losses stay on the device (its last chunk's forwards) and are
# fetched once; on the CPU target the same bits as without
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule interleaved --virtual-stages 2 --pp-split 2,1,1,1 --batch-size 4 --micro-batches 4 \
    --fused-kernels 1 --log "$TMP/3dif.jsonl" --save-model "$TMP/3dif.bin"
fused_same "2x2x2 interleaved ZeRO-1" 3dif 3di
# an interleaved checkpoint (its stages' shards) resumes bit-exact on its grid, and on other grids: one
# rank, and 3 stages of 1F1B, each to the suite's tolerance of the uninterrupted single-rank run
INT3D=(--dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule interleaved --virtual-stages 2 --batch-size 4 --micro-batches 4)
run 8 "${INT3D[@]}" --stop-after 5 --checkpoint-dir "$TMP/cki"
run 8 "${INT3D[@]}" --resume "$TMP/cki" --save-model "$TMP/3dir.bin" --log "$TMP/3dir.jsonl"
run 8 "${INT3D[@]}" --save-model "$TMP/3dis.bin"
if cmp -s "$TMP/3dis.bin" "$TMP/3dir.bin"; then echo "  ok    2x2x2 interleaved ZeRO-1 resumed at step 5: final model byte-identical"
else echo "  FAIL  2x2x2 interleaved ZeRO-1 resumed at step 5: final model differs"; fails=$((fails + 1)); fi
"$BIN" "${COMMON[@]}" --batch-size 8 --micro-batches 4 --resume "$TMP/cki" --checkpoint-dir "$TMP/ck1" --log "$TMP/r1.jsonl" --save-model "$TMP/r1.bin" >/dev/null
compare "interleaved checkpoint on 1 rank" "$TMP/r1.jsonl" "$TMP/r1.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin" 6
run 3 --pp 3 --pp-schedule 1f1b --batch-size 8 --micro-batches 4 --resume "$TMP/cki" --checkpoint-dir "$TMP/ck3" --log "$TMP/r3.jsonl" --save-model "$TMP/r3.bin"
compare "interleaved checkpoint on pp=3 1f1b" "$TMP/r3.jsonl" "$TMP/r3.bin" "$TMP/ref3d.jsonl" "$TMP/ref3d.bin" 6
# --fused-kernels 1 keeps each micro-step's mean loss on the device and fetches the step's losses in one
# copy at its end (1F1B: the last stage interleaves forwards and backwards); the CPU target must give the
# same bits as the run above, the GPU target (whose fused kernels sum in another order) the same run to
# the suite's tolerance
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule 1f1b --batch-size 4 --micro-batches 4 --fused-kernels 1 --log "$TMP/3df.jsonl" --save-model "$TMP/3df.bin"
fused_same "2x2x2 ZeRO-1 1f1b" 3df 3d
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --stop-after 5 --checkpoint-dir "$TMP/ck"
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --resume "$TMP/ck" --save-model "$TMP/3dr.bin"
run 8 --dp 2 --tp 2 --pp 2 --zero 1 --batch-size 4 --micro-batches 4 --save-model "$TMP/3ds.bin"
if cmp -s "$TMP/3ds.bin" "$TMP/3dr.bin"; then echo "  ok    2x2x2 ZeRO-1 resumed at step 5: final model byte-identical"
else echo "  FAIL  2x2x2 ZeRO-1 resumed at step 5: final model differs"; fails=$((fails + 1)); fi

echo "3. trace"
# Each rank's spans are on its own clock: they must share one origin (llmc/run/trace.h), or a receive seems
# to end before its send began. Every message, "act m" (forward) or "grad m" (backward), the k-th of its
# name in the traced steps, must end on the receiving stage after it started on the sending stage, in
# both directions (so a shift of either rank's clock is caught). The sending stage is the one before
# (activations) or after (gradients) on the ring of stages: the interleaved schedule's messages go from
# the last stage to the first, and back. Lanes: compute (tid 0), communication
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
    n_ranks = len({e["pid"] for e in events})
    ss = sends[((pid - stride if what.startswith("act") else pid + stride) % n_ranks, what)]  # the previous / next stage
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
    run 2 --pp 2 --pp-schedule $S --batch-size 8 --micro-batches 4 --steps 3 --trace "$TMP/trace_$S.json" --fault-clock-skew $skew
    grep -h "pipeline bubble" "$TMP/run.out" | sed 's/^/        /'
    check_trace "pp=2 $S, clock skew $skew s" "$TMP/trace_$S.json" 1 1 || fails=$((fails + 1))
    [ $S = gpipe ] && title="GPipe" || title="1F1B"
    check_title "pp=2 $S" "$TMP/trace_$S.json" "$TMP/run.out" \
        "dp 1 · tp 1 · pp 2 · $title · M=4 · bubble \d+% \(ideal 20%\)" - "forward;backward;optimizer;send;recv" \
        || fails=$((fails + 1))
done
# one stage given 4 layers and the classifier, the other one layer: a hint names --pp-split
run 2 --pp 2 --pp-split 1,4 --batch-size 8 --micro-batches 4 --steps 3 --trace "$TMP/trace_split.json"
check_title "pp=2 --pp-split 1,4" "$TMP/trace_split.json" "$TMP/run.out" \
    "dp 1 · tp 1 · pp 2 · GPipe · M=4 · bubble \d+% .*" 1 "" || fails=$((fails + 1))
run 3 --pp 3 --pp-schedule interleaved --virtual-stages 2 --layers 6 --batch-size 6 --micro-batches 3 --steps 3 --trace "$TMP/trace_int.json" --fault-clock-skew 0.5
grep -h "pipeline bubble" "$TMP/run.out" | sed 's/^/        /'
check_trace "pp=3 interleaved V=2, clock skew 0.5 s" "$TMP/trace_int.json" 1 1 || fails=$((fails + 1))
check_title "pp=3 interleaved V=2" "$TMP/trace_int.json" "$TMP/run.out" \
    "dp 1 · tp 1 · pp 3 · interleaved 1F1B · M=3 · V=2 · bubble \d+% \(ideal 25%\)" - "" || fails=$((fails + 1))
# its forwards and backwards are named by micro-batch and chunk, "F 2.1", on every stage, both chunks
"$PY" - "$TMP/trace_int.json" <<'PYEOF' || fails=$((fails + 1))
import json, re, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("cat") in ("forward", "backward")]
named = [re.fullmatch(r"[FB] [0-2]\.([01])", e["name"]) for e in spans]
ok = spans and all(named)
ok = ok and {(e["pid"], m.group(1)) for e, m in zip(spans, named)} == {(p, c) for p in range(3) for c in "01"}
print(f"  {'ok  ' if ok else 'FAIL'}  trace pp=3 interleaved V=2: forwards and backwards named with their chunk"
      + ("" if ok else f": {sorted({e['name'] for e in spans})[:8]}"))
sys.exit(0 if ok else 1)
PYEOF
# ZB-H1: each micro-batch's backward is two spans on each stage, its B and its W, in the schedule's order
run 3 --pp 3 --pp-schedule zb-h1 --batch-size 8 --micro-batches 4 --steps 3 --trace "$TMP/trace_zb.json" --fault-clock-skew 0.5
grep -h "pipeline bubble" "$TMP/run.out" | sed 's/^/        /'
check_trace "pp=3 zb-h1, clock skew 0.5 s" "$TMP/trace_zb.json" 1 1 || fails=$((fails + 1))
check_title "pp=3 zb-h1" "$TMP/trace_zb.json" "$TMP/run.out" \
    "dp 1 · tp 1 · pp 3 · ZB-H1 · M=4 · bubble \d+% \(ideal 14%\)" - "backward;backward W" || fails=$((fails + 1))
"$BIN" --print-schedule --pp 3 --batch-size 4 --micro-batches 4 --pp-schedule zb-h1 >"$TMP/sched_zb.out"
if "$PY" - "$TMP/trace_zb.json" "$TMP/sched_zb.out" <<'PYEOF'
import collections, json, re, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X" and e["cat"] in ("forward", "backward")]
want = {int(s): re.findall(r"\| ([FBW]\d+)(?= \|)", rest) for s, rest in re.findall(r"  stage +(\d+) \((.*)", open(sys.argv[2]).read())}
got = collections.defaultdict(list)
for e in sorted(events, key=lambda e: e["ts"]):
    got[e["pid"]].append(e["name"].replace(" ", ""))
bad = [s for s in want if len(want[s]) != 12 or got[s] != want[s] * 2]  # (the 2 traced steps)
print(f"  {'ok  ' if not bad else 'FAIL'}  trace pp=3 zb-h1: every stage's F, B and W spans in its printed order, twice" +
      (f"; stage {bad[0]}: {got[bad[0]][:12]} against {want[bad[0]]}" if bad else ""))
sys.exit(1 if bad else 0)
PYEOF
then :; else fails=$((fails + 1)); fi
run 8 --dp 2 --tp 2 --pp 2 --pp-schedule 1f1b --batch-size 4 --micro-batches 4 --steps 3 --trace "$TMP/trace3d.json" --fault-clock-skew 0.25
check_trace "2x2x2 1f1b, clock skew 0.25 s per rank" "$TMP/trace3d.json" 0 4 || fails=$((fails + 1))
check_title "2x2x2 1f1b" "$TMP/trace3d.json" "$TMP/run.out" \
    "dp 2 · tp 2 · pp 2 · 1F1B · M=4 · bubble \d+% \(ideal 20%\)" - "all-reduce;tp f/g (all-reduce);send + recv" \
    || fails=$((fails + 1))
cp "$TMP/trace_gpipe.json" "$TMP/trace.json"
if "$PY" -c "import matplotlib" 2>/dev/null; then
    if "$PY" "$(dirname "$0")/../scripts/plot_trace.py" "$TMP/trace.json" -o "$TMP/trace.png" >/dev/null && [ -s "$TMP/trace.png" ]; then echo "  ok    plot_trace.py rendered a PNG"
    else echo "  FAIL  plot_trace.py"; fails=$((fails + 1)); fi
    # The labels, on a trace made for it: every bar 1 ms long, wide enough for its name but the last,
    # 1 us, which gets none; a reduce-scatter recorded under "allreduce" (by its name) or "reducescatter"
    # is drawn and listed as one, apart from the all-reduce and the all-gather.
    "$PY" - "$(dirname "$0")/../scripts/plot_trace.py" "$TMP/labels" <<'PYEOF' || fails=$((fails + 1))
import json, subprocess, sys
plot, base = sys.argv[1:3]
spans = [("forward", "F 3.1"), ("backward", "B 3.1"), ("allreduce", "all-reduce 2"), ("allreduce", "reduce-scatter 3"),
         ("reducescatter", "reduce-scatter 4"), ("allgather", "gather 1"), ("send", "send act 2"),
         ("tp", "g (forward)"), ("allreduce", "reduce-scatter 5")]
events = [{"name": n, "cat": c, "ph": "X", "ts": 1000.0 * i, "dur": 1.0 if n.endswith("5") else 1000.0, "pid": 0,
           "tid": 0 if c in ("forward", "backward") else 1} for i, (c, n) in enumerate(spans)]
json.dump({"traceEvents": events}, open(base + ".json", "w"))
out = subprocess.run([sys.executable, plot, base + ".json", "-o", base + ".png", "--describe"], capture_output=True,
                     text=True).stdout
lines = dict(l.split(": ", 1) for l in out.splitlines() if ": " in l)
want_labels = ["F 3.1", "B 3.1", "AR 2", "RS 3", "RS 4", "AG 1", "send act 2", "g (forward)"]
want_legend = "forward, backward, send, all-reduce, reduce-scatter, all-gather, tp f/g (all-reduce)"
ok = lines.get("labels") == ", ".join(want_labels) and lines.get("legend") == want_legend
print(f"  {'ok  ' if ok else 'FAIL'}  plot_trace.py: bars labeled {want_labels} where they fit; legend {want_legend}"
      + ("" if ok else f"\n        got: {out!r}"))
sys.exit(0 if ok else 1)
PYEOF
fi

echo "4. --print-schedule"
# the GPipe timeline for P=2, M=4 equals the hand-drawn one in llmc/pipeline.h's header (where a
# backward's second slot is drawn '.': compare with '==' as '.', spaces squeezed, trailing idle dropped)
# (likewise the interleaved one for P=2, M=2, V=2, and ZB-H1's for P=2, M=2)
norm() { sed -e 's/==/./g' -e 's/  */ /g' -e 's/\( \.\)* *$//'; }
for c in "GPipe, P=2, M=4:--pp-schedule gpipe --batch-size 4 --micro-batches 4" \
         "interleaved, P=2, M=2, V=2:--pp-schedule interleaved --virtual-stages 2 --batch-size 2 --micro-batches 2" \
         "ZB-H1, P=2, M=2:--pp-schedule zb-h1 --batch-size 2 --micro-batches 2"; do
    title=${c%%:*}
    # shellcheck disable=SC2086  # (the flags are words)
    "$BIN" --print-schedule --pp 2 ${c#*:} >"$TMP/sched.out" 2>&1
    got=$(grep '^  stage  [01] |' "$TMP/sched.out" | sed 's/^  stage  \([01]\) |/stage \1/' | norm)
    want=$(grep -F -A2 " *   $title" llmc/pipeline.h | sed -n 's/^ \*   \(stage [01]\)   \(.*\)/\1 \2/p' | norm)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then echo "  ok    $title timeline equals the diagram in llmc/pipeline.h"
    else echo "  FAIL  $title timeline:"; echo "$got"; echo "  want:"; echo "$want"; fails=$((fails + 1)); fi
done
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
# 1F1B, P=2, M=2: the messages as the plan exchanges them, worked out by hand from its rules
"$BIN" --print-schedule --pp 2 --batch-size 2 --micro-batches 2 --pp-schedule 1f1b >"$TMP/sched.out" 2>&1
if grep -qF "stage  0 (2 activation slots) | F0 | send a0>1 | F1 | sendrecv a1>1 g0<1 | B0 | recv g1<1 | B1 |" "$TMP/sched.out" \
    && grep -qF "stage  1 (1 activation slot) | recv a0<0 | F0 | B0 | sendrecv g0>0 a1<0 | F1 | B1 | send g1>0 |" "$TMP/sched.out"; then
    echo "  ok    1F1B P=2 M=2 actions and messages as worked out by hand"
else echo "  FAIL  1F1B P=2 M=2 actions and messages:"; cat "$TMP/sched.out"; fails=$((fails + 1)); fi
# Every stage's printed actions and exchanges, run as blocking operations: a send completes only together
# with the receive that takes it (as NCCL's do, and MPI's beyond its eager size; a sendrecv when both its
# halves have), and each receive must take the message its sender sent next to it. All of them must
# complete: no stage waits forever, every message printed as sent is received, once, in the order sent
# (messages between two stages are not tagged). Timed (a forward 1, a backward 2, a message 0), the
# stages must also be idle exactly the fraction the printed formula gives: where the exchanges stand
# adds no wait to the schedule's bubble. GPipe and 1F1B for P 2..4, M 1, 4, 7; interleaved for P 2..4,
# V 2, 3, M P..3P.
check_exchanges() {  # SCHEDULE-OUTPUT
    "$PY" - "$1" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
ops = {}
for line in text.splitlines():
    m = re.match(r"  stage +(\d+) \(", line)
    if not m: continue
    seq = []
    for cell in line.split("|")[1:]:
        words = cell.split()
        if not words: continue
        if re.fullmatch(r"[FBW]\d+(\.\d+)?", words[0]):  # an action: its time (ZB-H1: B and W one each)
            seq.append(["compute", 2 if words[0][0] == "B" and "ZB-H1" not in text else 1])
            continue
        halves = [None, None]  # [send (peer, message), receive (peer, message)]
        for w in words[1:]:
            label, op, peer = re.fullmatch(r"([ag]\d+(?:\.\d+)?)([<>])(\d+)", w).groups()
            halves[op == "<"] = (int(peer), label)
        seq.append(["exchange"] + halves)
    ops[int(m.group(1))] = seq
formula = re.search(r"\(P-1\)/\((?:V\*|3)?M\+P-1\) = ([0-9.]+)%", text)
if not ops or not formula: print("no schedule printed"); sys.exit(1)
at, clock, busy = {s: 0 for s in ops}, {s: 0 for s in ops}, {s: 0 for s in ops}
met = {s: [None, None] for s in ops}  # when the current exchange's send / receive met its peer's
def current(s): return ops[s][at[s]] if at[s] < len(ops[s]) else ["done"]
while any(at[s] < len(ops[s]) for s in ops):
    moved = False
    for s in ops:  # actions run
        while current(s)[0] == "compute":
            clock[s] += current(s)[1]; busy[s] += current(s)[1]; at[s] += 1; moved = True
    for s in ops:  # a send meets the receive its peer is waiting in
        if current(s)[0] == "exchange" and current(s)[1] and met[s][0] is None:
            peer, label = current(s)[1]
            theirs = current(peer)
            if theirs[0] == "exchange" and theirs[2] and theirs[2][0] == s and met[peer][1] is None:
                if theirs[2][1] != label: print(f"stage {peer} receives {theirs[2][1]} from stage {s}, which sends {label}"); sys.exit(1)
                met[s][0] = met[peer][1] = max(clock[s], clock[peer])
                moved = True
    for s in ops:  # an exchange both of whose halves have met is complete
        c = current(s)
        if c[0] == "exchange" and (not c[1] or met[s][0] is not None) and (not c[2] or met[s][1] is not None):
            clock[s] = max([clock[s]] + [t for t in met[s] if t is not None])
            met[s], at[s], moved = [None, None], at[s] + 1, True
    if not moved:
        print("deadlock: " + "; ".join(f"stage {s} waits in {current(s)}" for s in ops if at[s] < len(ops[s]))); sys.exit(1)
width = max(clock.values())
idle = 100.0 * (1 - sum(busy.values()) / (width * len(ops)))
if f"{idle:.1f}" != formula.group(1): print(f"idle {idle:.1f}% when sends wait for their receives, the formula {formula.group(1)}%"); sys.exit(1)
PYEOF
}
before=$fails
for S in gpipe 1f1b; do for P in 2 3 4; do for M in 1 4 7; do
    "$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M --pp-schedule $S >"$TMP/sched.out" 2>&1 || echo "exit $?" >>"$TMP/sched.out"
    check_exchanges "$TMP/sched.out" || { echo "  FAIL  --print-schedule $S P=$P M=$M"; fails=$((fails + 1)); }
done; done; done
for P in 2 3 4; do for M in $P $((P + 1)) $((2 * P)) $((3 * P)); do
    "$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M --pp-schedule zb-h1 >"$TMP/sched.out" 2>&1 || echo "exit $?" >>"$TMP/sched.out"
    check_exchanges "$TMP/sched.out" || { echo "  FAIL  --print-schedule zb-h1 P=$P M=$M"; fails=$((fails + 1)); }
done; done
for P in 2 3 4; do for V in 2 3; do for M in $P $((2 * P)) $((3 * P)); do
    "$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M --pp-schedule interleaved --virtual-stages $V >"$TMP/sched.out" 2>&1 \
        || echo "exit $?" >>"$TMP/sched.out"
    check_exchanges "$TMP/sched.out" || { echo "  FAIL  --print-schedule interleaved P=$P V=$V M=$M"; fails=$((fails + 1)); }
done; done; done
[ $fails -eq $before ] && echo "  ok    every stage's exchanges complete as blocking operations, each message received once and in order, idle the formula's fraction: gpipe and 1f1b (P 2..4, M 1, 4, 7), interleaved (P 2..4, V 2, 3, M P, 2P, 3P), zb-h1 (P 2..4, M P, P+1, 2P, 3P)"

# the closing bubble line: with a forward one slot and a backward two, GPipe and 1F1B leave every stage
# idle 3(P-1) of 3(M+P-1) slots; the interleaved schedule, whose actions are a chunk's (1/V of a stage's
# layers), 3(P-1) of 3(VM+P-1); ZB-H1, whose F, B and W take a slot each, P-1 of 3M+P-1
for c in gpipe:2:4:1 1f1b:4:8:1 gpipe:3:1:1 1f1b:3:7:1 gpipe:4:8:1 interleaved:4:8:2 interleaved:2:4:3 interleaved:3:9:2 interleaved:4:4:3 \
         zb-h1:4:8:1 zb-h1:2:4:1 zb-h1:3:5:1 zb-h1:4:4:1; do
    IFS=: read -r S P M V <<< "$c"
    flags=(--pp-schedule "$S")
    [ "$V" -gt 1 ] && flags+=(--virtual-stages "$V")
    got=$("$BIN" --print-schedule --pp $P --batch-size $M --micro-batches $M "${flags[@]}" | tail -n 1)
    pct=$(awk -v p="$P" -v m="$M" -v v="$V" 'BEGIN { printf "%.1f", 100 * (p - 1) / (v * m + p - 1) }')
    formula="(P-1)/(M+P-1)"
    [ "$V" -gt 1 ] && formula="(P-1)/(V*M+P-1)"
    want="bubble: every stage is idle $((3 * (P - 1))) of the step's $((3 * (V * M + P - 1))) slots, $pct%; $formula = $pct%"
    if [ "$S" = zb-h1 ]; then
        pct=$(awk -v p="$P" -v m="$M" 'BEGIN { printf "%.1f", 100 * (p - 1) / (3 * m + p - 1) }')
        want="bubble: every stage is idle $((P - 1)) of the step's $((3 * M + P - 1)) slots, $pct%; (P-1)/(3M+P-1) = $pct%"
    fi
    if [ "$got" = "$want" ]; then echo "  ok    $S P=$P M=$M V=$V: $got"
    else echo "  FAIL  $S P=$P M=$M V=$V: '$got', want '$want'"; fails=$((fails + 1)); fi
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
INT=(--pp-schedule interleaved --virtual-stages 2)
expect_mpi_error "interleaved, M not a multiple of P" "3 micro-batches is not a multiple of --pp 2" 2 "$BIN" "${COMMON[@]}" --pp 2 "${INT[@]}" --batch-size 6 --micro-batches 3
expect_mpi_error "interleaved, one chunk" "needs --virtual-stages 2 or more" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-schedule interleaved --batch-size 2 --micro-batches 2
expect_mpi_error "interleaved without --pp" "--pp-schedule interleaved needs --pp > 1" 1 "$BIN" "${COMMON[@]}" "${INT[@]}"
expect_mpi_error "interleaved, --pp-rematerialize" "--pp-rematerialize with --pp-schedule interleaved is not supported" 2 "$BIN" "${COMMON[@]}" --pp 2 "${INT[@]}" --pp-rematerialize 1 --batch-size 2 --micro-batches 2
expect_mpi_error "interleaved, 6 chunks of 5 layers" "--pp 3 x --virtual-stages 2: more chunks than the 5 layers" 3 "$BIN" "${COMMON[@]}" --pp 3 "${INT[@]}" --batch-size 3 --micro-batches 3
expect_mpi_error "--virtual-stages with 1f1b" "--virtual-stages 2 needs --pp-schedule interleaved" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-schedule 1f1b --virtual-stages 2
expect_mpi_error "interleaved --pp-split of 2 stages, not 4 chunks" "expected 4 layer counts" 2 "$BIN" "${COMMON[@]}" --pp 2 "${INT[@]}" --pp-split 2,3 --batch-size 2 --micro-batches 2
expect_mpi_error "zb-h1, M < P" "--pp-schedule zb-h1: 2 micro-batches, fewer than --pp 3" 3 "$BIN" "${COMMON[@]}" --pp 3 --pp-schedule zb-h1 --batch-size 2 --micro-batches 2
expect_mpi_error "zb-h1 without --pp" "--pp-schedule zb-h1 needs --pp > 1" 1 "$BIN" "${COMMON[@]}" --pp-schedule zb-h1
expect_mpi_error "zb-h1, --recompute" "--pp-schedule zb-h1 with --recompute is not supported" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-schedule zb-h1 --recompute 1 --batch-size 2 --micro-batches 2
expect_mpi_error "zb-h1, --pp-rematerialize" "--pp-schedule zb-h1 with --pp-rematerialize is not supported" 2 "$BIN" "${COMMON[@]}" --pp 2 --pp-schedule zb-h1 --pp-rematerialize 1 --batch-size 2 --micro-batches 2

if [ $fails -ne 0 ]; then echo "pipeline_parallel: $fails FAILED"; exit 1; fi
echo "pipeline_parallel: all passed"
