#!/usr/bin/env bash
# launch.sh: how a rank learns its place (llmc/comm/launch.h), on the CPU target: Slurm variables count
# only in a task of srun; torchrun's variables count over the PMIx ones of the srun task that started
# torchrun, and contradicting an MPI world they are refused; a RANK that is no number is named as such;
# an MPMD peer that never starts MPI ends the job within --comm-timeout; OpenMP threads default to cores /
# local ranks (CPU target; the GPU target's ranks run one host thread).
# (The NCCL id's exchange over TCP: rendezvous.sh; torchrun-style launches of the NCCL engine: nccl_emulated.sh.)
# usage: tests/launch.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)

echo "launch"
# `sbatch -n 4` runs its script once: one process that sees the allocation's SLURM_NTASKS=4 but no step
if env SLURM_JOB_ID=1 SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1 \
    && grep -q "1 rank(s)" "$TMP/sb.out"; then echo "  ok    Slurm variables without a step (a batch script): one rank"
else echo "  FAIL  Slurm variables without a step (a batch script) must run as one rank"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# in a task of srun the same variables make 4 ranks (which the CPU build can only run under mpirun)
env SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_NTASKS=4 SLURM_PROCID=0 SLURM_LOCALID=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
if grep -q "^error: several ranks need mpirun" "$TMP/sb.out"; then echo "  ok    the same under srun: 4 ranks ($(grep '^error:' "$TMP/sb.out"))"
else echo "  FAIL  the same under srun must mean 4 ranks"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# `srun --mpi=pmix torchrun ...`: the workers inherit the PMIx variables of the srun task that ran torchrun,
# yet torchrun's describe them (2 ranks here, which the CPU build can only run under mpirun); they trained
# alone, each as a world of one
env PMIX_RANK=0 PMIX_NAMESPACE=slurm.pmix.1.0 SLURM_JOB_ID=1 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=1 SLURM_PROCID=0 SLURM_LOCALID=0 \
    WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
if grep -q "^error: several ranks need mpirun.*torchrun's WORLD_SIZE says 2" "$TMP/sb.out"; then echo "  ok    torchrun under srun with PMIx: torchrun's 2 ranks ($(grep '^error:' "$TMP/sb.out"))"
else echo "  FAIL  torchrun under srun with PMIx must mean torchrun's 2 ranks"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# mpirun's 2 processes with WORLD_SIZE=4 (no torchrun started once in each: that would make 2 x LOCAL_WORLD_SIZE)
timeout 60 "${MPIRUN[@]}" -np 2 -x WORLD_SIZE=4 -x RANK=0 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c '^error:' "$TMP/sb.out")" -eq 1 ] && grep -q "^error: the launchers disagree: .*WORLD_SIZE=4" "$TMP/sb.out"; then
    echo "  ok    mpirun -np 2 with WORLD_SIZE=4: exit $rc, $(grep '^error:' "$TMP/sb.out")"
else echo "  FAIL  mpirun -np 2 with WORLD_SIZE=4: exit $rc (want one line: the launchers disagree)"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# a launcher variable that is no number: atoi made RANK=abc rank 0, and two ranks 0 named another cause
env WORLD_SIZE=2 RANK=abc LOCAL_RANK=0 timeout 60 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/sb.out" 2>&1
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c . "$TMP/sb.out")" -eq 1 ] && grep -q "^error: RANK is 'abc': not a number" "$TMP/sb.out"; then
    echo "  ok    RANK=abc: $(cat "$TMP/sb.out")"
else echo "  FAIL  RANK=abc: exit $rc (want 1 and one line: RANK is not a number)"; tail -2 "$TMP/sb.out"; fails=$((fails + 1)); fi
# an MPMD peer that never starts MPI (here `sleep`): MPI_Init cannot be polled, and waited until the peer ended
start=$(date +%s)
timeout 60 "${MPIRUN[@]}" -np 1 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 --comm-timeout 3 : -np 1 sleep 40 >"$TMP/mi.out" 2>&1
rc=$? took=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $took -le 20 ] && grep -q "^error: MPI_Init did not complete within 3 s (--comm-timeout)" "$TMP/mi.out"; then
    echo "  ok    a peer that never starts MPI: exit $rc after $took s, $(grep '^error:' "$TMP/mi.out")"
else echo "  FAIL  a peer that never starts MPI: exit $rc after $took s (want one line within 20 s: MPI_Init did not complete)"; grep -m2 . "$TMP/mi.out"; fails=$((fails + 1)); fi
# OpenMP threads: without OMP_NUM_THREADS, the cores this process may use / the ranks on the node
cores=$(env -u OMP_NUM_THREADS nproc)  # (nproc itself honours OMP_NUM_THREADS)
want=$((cores / 2)); [ $want -lt 1 ] && want=1
env -u OMP_NUM_THREADS timeout 60 "${MPIRUN[@]}" -np 2 "$BIN" "${COMMON[@]}" --batch-size 2 --steps 1 >"$TMP/omp.out" 2>&1
if gpu_target; then echo "  skip  2 ranks, OMP_NUM_THREADS unset: the GPU target runs one host thread per rank (sets no OpenMP threads)"
elif grep -q "^threads: $want OpenMP thread(s) per rank (OMP_NUM_THREADS unset" "$TMP/omp.out"; then echo "  ok    2 ranks, OMP_NUM_THREADS unset: $want thread(s) each ($cores cores)"
else echo "  FAIL  2 ranks, OMP_NUM_THREADS unset: want $want thread(s) each"; grep "threads\|error" "$TMP/omp.out" | head -3; fails=$((fails + 1)); fi

if [ $fails -ne 0 ]; then echo "launch: $fails FAILED"; exit 1; fi
echo "launch: all passed"
