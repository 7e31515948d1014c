#!/usr/bin/env bash
# nccl_emulated.sh: the NCCL engine of the GPU target (llmc/comm/nccl_engine.h), run on a machine without a
# GPU: the emulated train_gpt (make emulated) with EMU_DEVICES GPUs, so that its ranks take one each and
# pick NCCL, whose calls dev/emulate/emulate_nccl.h carries out between the processes. Against single-rank
# runs of the same binary (every loss to 1e-5 relative, final parameters to 1e-5 relative norm, as
# tests/*_parallel.sh and zero.sh: sums over ranks are taken in another order than one rank's):
#   1. under mpirun (the NCCL id through MPI): DP with ZeRO 0, 1, 2 and 3 (reduce-scatter, all-gather; at
#      ZeRO-3 per layer into two layer buffers, 3 layers, the main stream waiting on the gathers' events),
#      with gradient accumulation; TP 2; PP 2 GPipe and 1F1B (send/receive, the embedding group's
#      all-reduce of the tied wte); dp x tp x pp = 2 x 2 x 2 with ZeRO-1; interleaved PP 3, and in the
#      2 x 2 x 2 grid; ZB-H1 PP 3 (its input gradients sent before a W or paired after it), and in the
#      2 x 2 x 2 grid; every run must say "engine NCCL";
#      a final model written slower than --comm-timeout (the other ranks wait under --io-timeout)
#   2. launched as torchrun does, without mpirun: the NCCL id over TCP at MASTER_ADDR:MASTER_PORT
#      (llmc/comm/rendezvous.h), and through a file in a shared folder (--nccl-id-dir); and over TCP with the
#      PMIx variables of an srun task that started torchrun (torchrun's variables count); a restarted
#      attempt (TORCHELASTIC_RESTART_COUNT) beside the id file its crashed predecessor left
#   3. the deadline: a rank that never joins, and a rank killed mid-run, end the other rank with one line
#      naming what it waited for, within --comm-timeout (the engine's polling of ncclCommGetAsyncError);
#      a rank stopped mid-run under ZeRO-2, while the other's host waits inside CUDA (llmc/comm/watchdog.h);
#      rank 0 killed during a checkpoint save ends rank 1 within seconds, not after --io-timeout (its
#      connection to rank 0 closes: llmc/comm/liveness.h), with the id through a folder and over TCP
#   4. (given the emulated BF16 train_gpt) BF16 data-parallel with ZeRO-2 gives the MPI engine's bits, and
#      so does ZeRO-3 (the same reduced parts and updates; the parameters gathered per layer, not per step);
#      BF16 ZB-H1 gives 1F1B's bits (the same products, each weight gradient accumulated in the same order)
#   5. (BF16) the MPI engine staged through host buffers in 4 KiB pieces (LLMC_MPI_STAGE_BYTES: copy streams
#      and events) gives the whole-buffer bits, in dp 2 ZeRO-2 and in pp 3 1F1B, with the copy streams'
#      work run after the main stream's and before it (EMU_STREAMS=main-late, dev/emulate/README.md)
# The emulated operations run when the host waits for their stream, reading and writing their buffers then,
# and a send waits for its receive (emulate_nccl.h): a buffer touched before its stream is waited for gives
# wrong results here (part 1's rematerialized pipeline: its sends leave a buffer the next forward overwrites).
# dev/emulate/emulate_nccl_selftest.cu shows each rule (and a deadlock, a mismatched collective) in two processes.
# usage: tests/nccl_emulated.sh build/emu-fp32/train_gpt [build/emu-bf16/train_gpt]
set -u
BIN=${1:-build/emu-fp32/train_gpt}
BIN_BF16=${2:-}  # the emulated BF16 train_gpt, for part 4 (optional)
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
[ -x "$BIN" ] || { echo "nccl_emulated: $BIN not built (make emulated)"; exit 1; }
BIN=$(realpath "$BIN")
if [ -n "$BIN_BF16" ]; then BIN_BF16=$(realpath "$BIN_BF16"); fi
cd "$TMP"  # (the runs' default checkpoint folder is ./checkpoints)
grep -q "emulated NCCL" "$BIN" || { echo "nccl_emulated: $BIN has no emulated NCCL (nccl.h was not found when it was built)"; exit 1; }
export EMU_DEVICES=8 EMU_NCCL_DIR=$TMP/nccl EMU_NCCL_TIMEOUT=60
mkdir -p "$EMU_NCCL_DIR"
make_tokens "$TMP/tokens.bin"
COMMON=(--layers 3 --channels 32 --heads 4 --vocab 512 --max-seq-len 16 --seq-len 16 --steps 6 --lr 1e-3
        --warmup 2 --val-every 0 --sample-every 0 --train-data "$TMP/tokens.bin" --tokenizer "" --shuffle 1)

reference() {  # ARGS...: the single-rank run into ref.jsonl / ref.bin
    "$BIN" "${COMMON[@]}" "$@" --log "$TMP/ref.jsonl" --save-model "$TMP/ref.bin" >/dev/null 2>&1 \
        || { echo "  FAIL  single-rank reference $*"; fails=$((fails + 1)); }
}
# NAME NP ARGS...: under mpirun, on the NCCL engine, equal to the reference
nccl_run() {
    local name=$1 np=$2 before=$fails
    shift 2
    run "$np" "$@" --log "$TMP/run.jsonl" --save-model "$TMP/run.bin"
    [ $fails -eq $before ] || return
    if ! grep -q "engine NCCL" "$TMP/run.out"; then
        echo "  FAIL  $name: not on the NCCL engine"; grep -m1 "engine" "$TMP/run.out"; fails=$((fails + 1)); return
    fi
    compare "$name" "$TMP/run.jsonl" "$TMP/run.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
}

# two ranks started by hand, as torchrun starts them; ARGS... for both
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
launch_two() {  # ENV... -- ARGS...: starts ranks 0 and 1 (pids in $pid0 $pid1, output in $TMP/rank0.out, rank1.out)
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    for r in 0 1; do
        rm -f "$TMP/rank$r.out"  # (a background job truncates its output only when it starts: no earlier run's lines)
        env "${envs[@]}" WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 timeout 120 "$BIN" "${COMMON[@]}" "$@" \
            >"$TMP/rank$r.out" 2>&1 &
        eval "pid$r=$!"
    done
}

echo "1. under mpirun, the NCCL engine against the single-rank run"
for A in 1 2; do
    reference --batch-size 4 --grad-accum $A
    for Z in 0 1 2 3; do
        [ $Z -eq 0 ] && [ $A -eq 2 ] && continue
        nccl_run "dp=2 ZeRO-$Z grad_accum=$A" 2 --batch-size 2 --grad-accum $A --zero $Z
    done
done
reference --batch-size 2
nccl_run "tp=2" 2 --tp 2 --batch-size 2
reference --batch-size 4 --micro-batches 2
for S in gpipe 1f1b; do
    nccl_run "pp=2 M=2 $S" 2 --pp 2 --pp-schedule $S --batch-size 4 --micro-batches 2
done
# (its forward outputs are sent from the shared work set, which the next forward overwrites: the send
# must be waited for, as the emulated stream reads the buffer only when it runs the send)
nccl_run "pp=2 M=2 1f1b rematerialized" 2 --pp 2 --pp-schedule 1f1b --pp-rematerialize 1 --batch-size 4 --micro-batches 2
# interleaved (its exchanges round the ring of stages, every send waiting for its receive): 3 stages of
# 2 chunks of 1 layer, and in the 3D grid 2 stages of 2 chunks (--pp-split 1,1,1,3 of 6 layers)
reference --batch-size 6 --micro-batches 6 --layers 6
nccl_run "pp=3 M=6 interleaved V=2" 3 --pp 3 --pp-schedule interleaved --virtual-stages 2 --batch-size 6 --micro-batches 6 --layers 6
nccl_run "pp=3 M=6 zb-h1" 3 --pp 3 --pp-schedule zb-h1 --batch-size 6 --micro-batches 6 --layers 6
reference --batch-size 8 --micro-batches 4 --layers 6
nccl_run "2x2x2 ZeRO-1 interleaved V=2" 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule interleaved --virtual-stages 2 --pp-split 1,1,1,3 \
    --batch-size 4 --micro-batches 4 --layers 6
reference --batch-size 8 --micro-batches 4  # (also the size of the model the slow save below must write)
nccl_run "dp x tp x pp = 2x2x2 ZeRO-1 1f1b" 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule 1f1b --batch-size 4 --micro-batches 4
nccl_run "dp x tp x pp = 2x2x2 ZeRO-1 zb-h1" 8 --dp 2 --tp 2 --pp 2 --zero 1 --pp-schedule zb-h1 --batch-size 4 --micro-batches 4

# the final model written slowly (--save-model, 6 s) under --comm-timeout 3: the other rank went on to
# finalize the communicators, gave up after 3 s and ended the job while rank 0 was still writing
timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --comm-timeout 3 --fault-slow-save 6 \
    --save-model "$TMP/slow.bin" >"$TMP/slow.out" 2>&1
rc=$?
if [ $rc -eq 0 ] && [ "$(stat -c %s "$TMP/slow.bin" 2>/dev/null)" = "$(stat -c %s "$TMP/ref.bin")" ]; then  # (the same model sizes)
    echo "  ok    --save-model 6 s slow with --comm-timeout 3: exit 0 on both ranks, the model complete"
else echo "  FAIL  --save-model 6 s slow with --comm-timeout 3: exit $rc"; grep -m2 "error" "$TMP/slow.out"; fails=$((fails + 1)); fi

echo "2. launched without mpirun"
reference --batch-size 4
# (srun-pmix: torchrun started by `srun --mpi=pmix` on one node; its workers inherit the task's PMIx and
# Slurm variables, and must still join torchrun's world, not each start MPI as a world of one)
SRUN_PMIX=(PMIX_RANK=0 PMIX_NAMESPACE=slurm.pmix.1.0 SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0)
for how in tcp folder srun-pmix; do
    if [ $how = tcp ]; then launch_two MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" -- --batch-size 2 --log "$TMP/run.jsonl" --save-model "$TMP/run.bin"
    elif [ $how = srun-pmix ]; then
        launch_two "${SRUN_PMIX[@]}" MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" -- --batch-size 2 --log "$TMP/run.jsonl" --save-model "$TMP/run.bin"
    else mkdir -p "$TMP/ids"; launch_two -- --batch-size 2 --nccl-id-dir "$TMP/ids" --log "$TMP/run.jsonl" --save-model "$TMP/run.bin"; fi
    rc0=0 rc1=0
    wait "$pid0" || rc0=$?
    wait "$pid1" || rc1=$?
    if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ] || ! grep -q "engine NCCL" "$TMP/rank0.out"; then
        echo "  FAIL  dp=2, the NCCL id by $how: exit $rc0 and $rc1"; tail -n 3 "$TMP/rank0.out" "$TMP/rank1.out"; fails=$((fails + 1))
    else
        compare "dp=2, the NCCL id by $how" "$TMP/run.jsonl" "$TMP/run.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
    fi
done

# torchrun restarts the workers of a failed attempt with the same run id and TORCHELASTIC_RESTART_COUNT + 1;
# attempt 0 crashed and left its id file (rank 0 alone: creating the communicator timed out). Attempt 1's
# rank 1 starts first: it read attempt 0's file, and both ranks ended "a peer rank is stopped, hung or gone".
mkdir -p "$TMP/ids_restart"
TORCHELASTIC_RUN_ID=job7 TORCHELASTIC_RESTART_COUNT=0 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 \
    --nccl-id-dir "$TMP/ids_restart" --comm-timeout 2 >"$TMP/attempt0.out" 2>&1
stale=$(ls "$TMP/ids_restart" | tr '\n' ' ')
rc0=0 rc1=0
for r in 1 0; do
    TORCHELASTIC_RUN_ID=job7 TORCHELASTIC_RESTART_COUNT=1 WORLD_SIZE=2 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 timeout 120 "$BIN" \
        "${COMMON[@]}" --batch-size 2 --nccl-id-dir "$TMP/ids_restart" --comm-timeout 20 --log "$TMP/run.jsonl" --save-model "$TMP/run.bin" \
        >"$TMP/rank$r.out" 2>&1 &
    eval "pid$r=$!"
    sleep 2  # (rank 1 looks for the id before rank 0 of this attempt has written it)
done
wait "$pid0" || rc0=$?
wait "$pid1" || rc1=$?
if [ -n "$stale" ] && [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ]; then
    compare "restart 1 beside attempt 0's id file ($stale)" "$TMP/run.jsonl" "$TMP/run.bin" "$TMP/ref.jsonl" "$TMP/ref.bin"
else
    echo "  FAIL  restart 1 beside attempt 0's id file ('$stale'): exit $rc0 and $rc1"; tail -n 2 "$TMP/rank0.out" "$TMP/rank1.out"
    fails=$((fails + 1))
fi

# RANK=abc read as rank 0: two ranks 0, and one of them said the port was already in use
port=$(free_port)
for r in 0 abc; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" WORLD_SIZE=2 RANK=$r LOCAL_RANK=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 \
        --comm-timeout 3 >"$TMP/rank$r.out" 2>&1 &
    eval "pid_$r=$!"
    sleep 1
done
rc1=0
wait "$pid_abc" || rc1=$?
wait "$pid_0"
if [ $rc1 -eq 1 ] && [ "$(grep -c . "$TMP/rankabc.out")" -eq 1 ] && grep -q "^error: RANK is 'abc': not a number" "$TMP/rankabc.out"; then
    echo "  ok    RANK=abc: $(cat "$TMP/rankabc.out")"
else echo "  FAIL  RANK=abc: exit $rc1 (want 1 and one line: RANK is not a number)"; tail -n 2 "$TMP/rankabc.out"; fails=$((fails + 1)); fi

echo "3. the deadline (--comm-timeout 3)"
# NAME PATTERN RC SECONDS: rank 0 exited with RC within SECONDS (measured from $t0), its last line matching PATTERN
expect_end() {
    local name=$1 pattern=$2 rc=$3 secs=$4
    if [ "$rc" -ne 0 ] && [ $((SECONDS - t0)) -le "$secs" ] && tail -n 1 "$TMP/rank0.out" | grep -q -- "$pattern"; then
        echo "  ok    $name: exit $rc after $((SECONDS - t0)) s: $(tail -n 1 "$TMP/rank0.out")"
    else
        echo "  FAIL  $name: exit $rc after $((SECONDS - t0)) s (at most $secs expected), last line:"; tail -n 1 "$TMP/rank0.out"; fails=$((fails + 1))
    fi
}
mkdir -p "$TMP/ids1"
t0=$SECONDS rc=0
WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --nccl-id-dir "$TMP/ids1" --comm-timeout 3 \
    >"$TMP/rank0.out" 2>&1 || rc=$?
expect_end "rank 1 never joins" "creating the NCCL communicator.* did not complete within 3 s" $rc 30
mkdir -p "$TMP/ids2"
t0=$SECONDS
launch_two -- --batch-size 2 --steps 100000 --nccl-id-dir "$TMP/ids2" --comm-timeout 3
for _ in $(seq 600); do grep -q "^step     3" "$TMP/rank0.out" && break; sleep 0.1; done
grep -q "^step     3" "$TMP/rank0.out" || { echo "  FAIL  rank 1 killed after step 3: step 3 never came"; fails=$((fails + 1)); }
exec 3>&2 2>/dev/null  # (bash's "Killed" line for the job)
kill -KILL $(children_of "$pid1")  # (the trainer, child of its `timeout`)
rc=0
wait "$pid0" || rc=$?
wait "$pid1"
exec 2>&3 3>&-
expect_end "rank 1 killed after step 3" "did not complete within 3 s" $rc 90
# rank 1 stopped at step 3 (SIGSTOP: alive, its connections open) under ZeRO-2: rank 0's main stream waits
# for the DP stream's reduce-scatter, and its host waits inside CUDA (the emulation: in that wait itself;
# a GPU: in the next copy), where the engine's polling never runs; the watchdog (llmc/comm/watchdog.h) must end
# it with one line within --comm-timeout (without it: a hang, here until EMU_NCCL_TIMEOUT). --fused-kernels 0:
# the plain step's host waits there; the fused step's host does not, and blocks in its next communication,
# whose deadline ends it with the line of the case above
mkdir -p "$TMP/ids4"
launch_two -- --batch-size 2 --steps 100000 --zero 2 --nccl-id-dir "$TMP/ids4" --comm-timeout 3 --fault-rank 1 --fault-step 3 --fault-stop 1 \
    --fused-kernels 0
for _ in $(seq 600); do grep -q "stopping myself" "$TMP/rank1.out" && break; sleep 0.1; done
t0=$SECONDS rc=0
wait "$pid0" || rc=$?
exec 3>&2 2>/dev/null  # (bash's "Killed" line for the job)
kill -CONT $(children_of "$pid1") 2>/dev/null
kill -KILL $(children_of "$pid1") 2>/dev/null
wait "$pid1"
exec 2>&3 3>&-
expect_end "rank 1 stopped at step 3, ZeRO-2" "^error: rank 0: the main stream's wait for a ZeRO-2 reduce-scatter did not complete within 3 s (--comm-timeout)" $rc 15
n=$(grep -c '^error:' "$TMP/rank0.out")
[ "$n" -eq 1 ] || { echo "  FAIL  rank 1 stopped at step 3, ZeRO-2: $n error lines (want one)"; fails=$((fails + 1)); }

# rank 0 killed while it writes a checkpoint (30 s slow): rank 1, waiting for the save, waited out
# --io-timeout (an hour by default; 100 s here); it must end within seconds, naming rank 0
for how in folder tcp; do
    mkdir -p "$TMP/ids3"
    if [ $how = tcp ]; then launch_two MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" -- --batch-size 2 --steps 100 --save-every 2 \
        --fault-slow-save 30 --comm-timeout 3 --io-timeout 100 --checkpoint-dir "$TMP/ck_$how"
    else launch_two -- --batch-size 2 --steps 100 --save-every 2 --fault-slow-save 30 --comm-timeout 3 --io-timeout 100 \
        --nccl-id-dir "$TMP/ids3" --checkpoint-dir "$TMP/ck_$how"; fi
    for _ in $(seq 600); do grep -q "^step     2" "$TMP/rank0.out" && break; sleep 0.1; done
    sleep 1  # (rank 1 waits in the save's barrier; rank 0 sleeps before writing)
    exec 3>&2 2>/dev/null  # (bash's "Killed" lines for the jobs)
    kill -KILL $(children_of "$pid0")  # (the trainer, child of its `timeout`)
    t0=$SECONDS
    for _ in $(seq 300); do kill -0 "$pid1" 2>/dev/null || break; sleep 0.1; done
    took=$((SECONDS - t0))
    kill -KILL $(children_of "$pid1") 2>/dev/null  # (still waiting after 30 s)
    rc=0
    wait "$pid1" || rc=$?
    wait "$pid0"
    exec 2>&3 3>&-
    if [ $rc -eq 1 ] && [ $took -le 10 ] && [ "$(grep -c '^error:' "$TMP/rank1.out")" -eq 1 ] \
        && grep -q "^error: rank 1: rank 0 has ended .* around file I/O" "$TMP/rank1.out"; then
        echo "  ok    rank 0 killed during a save (id by $how): rank 1 exit $rc after $took s: $(grep '^error:' "$TMP/rank1.out")"
    else echo "  FAIL  rank 0 killed during a save (id by $how): rank 1 exit $rc after $took s (want 1 within 10 s, one line)"
        tail -n 2 "$TMP/rank1.out"; fails=$((fails + 1)); fi
done

if [ -n "$BIN_BF16" ]; then
    echo "4. BF16 (ncclBfloat16): dp=2 ZeRO-2, the same bits as the MPI engine"
    # With two ranks both engines add the two BF16 values exactly before rounding once (the emulation in
    # double, the MPI engine in float), so the models and losses must be identical, not merely close.
    for d in 1 8; do  # one emulated GPU: the ranks share it and take the MPI engine
        EMU_DEVICES=$d timeout 120 "${MPIRUN[@]}" -np 2 "$BIN_BF16" "${COMMON[@]}" --batch-size 2 --zero 2 --log "$TMP/bf16-$d.jsonl" \
            --save-model "$TMP/bf16-$d.bin" >"$TMP/bf16-$d.out" 2>&1 || { echo "  FAIL  BF16 run with $d GPUs"; tail -3 "$TMP/bf16-$d.out"; fails=$((fails + 1)); }
    done
    if grep -q "engine MPI" "$TMP/bf16-1.out" && grep -q "engine NCCL" "$TMP/bf16-8.out" && cmp -s "$TMP/bf16-1.bin" "$TMP/bf16-8.bin" &&
        [ "$(grep -o '"loss": [^,]*' "$TMP/bf16-1.jsonl")" = "$(grep -o '"loss": [^,]*' "$TMP/bf16-8.jsonl")" ] &&
        [ "$(grep -c '"loss"' "$TMP/bf16-8.jsonl")" -eq 6 ]; then
        echo "  ok    BF16 dp=2 ZeRO-2: NCCL engine = MPI engine, byte for byte (6 losses, model file)"
    else
        echo "  FAIL  BF16 dp=2 ZeRO-2: the NCCL and MPI engines differ (or a run did not take its engine)"; fails=$((fails + 1))
    fi
    timeout 120 "${MPIRUN[@]}" -np 2 "$BIN_BF16" "${COMMON[@]}" --batch-size 2 --zero 3 --log "$TMP/bf16-z3.jsonl" \
        --save-model "$TMP/bf16-z3.bin" >"$TMP/bf16-z3.out" 2>&1 || { echo "  FAIL  BF16 ZeRO-3 run"; tail -3 "$TMP/bf16-z3.out"; fails=$((fails + 1)); }
    if grep -q "engine NCCL" "$TMP/bf16-z3.out" && cmp -s "$TMP/bf16-1.bin" "$TMP/bf16-z3.bin" &&
        [ "$(grep -o '"loss": [^,]*' "$TMP/bf16-1.jsonl")" = "$(grep -o '"loss": [^,]*' "$TMP/bf16-z3.jsonl")" ]; then
        echo "  ok    BF16 dp=2 ZeRO-3 on the NCCL engine = ZeRO-2 on the MPI engine, byte for byte (losses, model file)"
    else
        echo "  FAIL  BF16 dp=2 ZeRO-3 (NCCL) differs from ZeRO-2 (MPI)"; fails=$((fails + 1))
    fi
    for S in 1f1b zb-h1; do
        timeout 120 "${MPIRUN[@]}" -np 3 "$BIN_BF16" "${COMMON[@]}" --pp 3 --pp-schedule $S --batch-size 8 --micro-batches 4 \
            --log "$TMP/bf16-$S.jsonl" --save-model "$TMP/bf16-$S.bin" >"$TMP/bf16-$S.out" 2>&1 || { echo "  FAIL  BF16 pp=3 $S run"; tail -3 "$TMP/bf16-$S.out"; fails=$((fails + 1)); }
    done
    if grep -q "engine NCCL" "$TMP/bf16-zb-h1.out" && cmp -s "$TMP/bf16-1f1b.bin" "$TMP/bf16-zb-h1.bin" &&
        [ "$(grep -o '"loss": [^,]*' "$TMP/bf16-1f1b.jsonl")" = "$(grep -o '"loss": [^,]*' "$TMP/bf16-zb-h1.jsonl")" ]; then
        echo "  ok    BF16 pp=3 M=4 on the NCCL engine: ZB-H1 = 1F1B, byte for byte (losses, model file)"
    else
        echo "  FAIL  BF16 pp=3 M=4: ZB-H1 differs from 1F1B"; fails=$((fails + 1))
    fi
    echo "5. the MPI engine's staging through host buffers (LLMC_MPI_STAGE_BYTES, llmc/comm/staging.h), its copy streams after and before the main stream's work"
    # Pieces of 4 KiB: each buffer goes through the two host buffers many times. The copy streams' work runs
    # after the main stream's (the emulation's default: a host buffer reused before its upload has read it shows)
    # and before it (EMU_STREAMS=main-late: a download before the main stream's writes it waits for
    # shows). The staged runs must give the whole-buffer MPI run's bits (dp 2 ZeRO-2, reduced in float on
    # the wire) and the NCCL 1F1B run's (pp 3: sends are exact copies).
    for order in default main-late; do
        for r in "dp:2:bf16-1:--batch-size 2 --zero 2" "pp:3:bf16-1f1b:--pp 3 --pp-schedule 1f1b --batch-size 8 --micro-batches 4"; do
            IFS=: read -r name np want flags <<< "$r"
            read -r -a flags <<< "$flags"
            EMU_STREAMS=$order EMU_DEVICES=1 LLMC_MPI_STAGE_BYTES=4096 timeout 120 "${MPIRUN[@]}" -x EMU_STREAMS -x LLMC_MPI_STAGE_BYTES \
                -np "$np" "$BIN_BF16" "${COMMON[@]}" "${flags[@]}" --log "$TMP/staged-$name.jsonl" --save-model "$TMP/staged-$name.bin" \
                >"$TMP/staged-$name.out" 2>&1 || { echo "  FAIL  staged $name run ($order)"; tail -3 "$TMP/staged-$name.out"; fails=$((fails + 1)); continue; }
            if grep -q "engine MPI" "$TMP/staged-$name.out" && cmp -s "$TMP/$want.bin" "$TMP/staged-$name.bin" &&
                [ "$(grep -o '"loss": [^,]*' "$TMP/$want.jsonl")" = "$(grep -o '"loss": [^,]*' "$TMP/staged-$name.jsonl")" ]; then
                echo "  ok    BF16 ${flags[*]}, streams $order: the MPI engine staged in 4 KiB pieces = $want, byte for byte"
            else
                echo "  FAIL  BF16 ${flags[*]}, streams $order: the staged MPI run differs from $want (or did not take the MPI engine)"
                fails=$((fails + 1))
            fi
        done
    done
fi

if [ $fails -ne 0 ]; then echo "nccl_emulated: $fails failure(s)"; exit 1; fi
echo "nccl_emulated: passed"
