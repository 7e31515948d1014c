#!/usr/bin/env bash
# data_parallel.sh: data parallelism (gradients all-reduced as each layer finishes, llmc/zero.h) on the CPU
# target under mpirun, against single-rank runs.
#   1. equivalence: dp in {2,3,4} x grad_accum in {1,2} (ZeRO 0; ZeRO 1 and 2: zero.sh): 10 steps equal the
#      single-rank run of the same global batch (dp x B sequences per micro-step): every loss to 1e-5
#      relative and the final parameters to 1e-5 relative norm (fp32; sums over ranks are taken in
#      another order than one rank's, so results agree to rounding, ~1e-7, not bit for bit)
#      (every run in the MPI engine's strict mode, see lib.sh)
#   2. bad input: a world size that is not dp x tp x pp
# Also about data-parallel runs: zero.sh (ZeRO, sharded checkpoints), faults.sh (a rank that dies, stops
# or is slow), signals.sh, rank_agreement.sh, launch.sh, staging.sh (the MPI engine in pieces).
# usage: tests/data_parallel.sh [path/to/train_gpt]   (default build/cpu/train_gpt)
set -u
BIN=${1:-build/cpu/train_gpt}
# shellcheck source=tests/lib.sh
source "$(dirname "$0")/lib.sh"
use_small_run  # $TMP/tokens.bin and COMMON (tests/lib.sh)
B=2

echo "1. equivalence with the single-rank run of the same global batch"
dp_equivalence "$B" 0

echo "2. bad input"
expect_mpi_error "world size 3 with --dp 2" "world size 3 does not equal dp x tp x pp = 2 x 1 x 1" 3 "$BIN" "${COMMON[@]}" --batch-size 2 --dp 2

if [ $fails -ne 0 ]; then echo "data_parallel: $fails FAILED"; exit 1; fi
echo "data_parallel: all passed"
