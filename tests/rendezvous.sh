#!/usr/bin/env bash
# rendezvous.sh: the exchange of the NCCL id over TCP at MASTER_ADDR:MASTER_PORT (llmc/comm/rendezvous.h),
# which a GPU launch by torchrun without a shared folder uses. It has no CUDA in it, so it is tested here
# with real processes on 127.0.0.1: tests/rendezvous.cpp runs one case per call (see its header),
# each under a timeout, so a hang fails the case instead of the suite. Together about 20 s.
# Usage: tests/rendezvous.sh [build/cpu/test_rendezvous]
set -u
cd "$(dirname "$0")/.."
BIN=${1:-build/cpu/test_rendezvous}
[ -x "$BIN" ] || { echo "rendezvous: $BIN not built (make build/cpu/test_rendezvous)"; exit 1; }
fails=0
for c in exchange big-blob strangers env no-rank0 world job port-in-use not-trainer peer-dies rank0-dies; do
    timeout 20 "$BIN" "$c"
    rc=$?
    if [ $rc -eq 124 ]; then echo "  FAIL  $c: still running after 20 s (a hang)"; fi
    [ $rc -eq 0 ] || fails=$((fails + 1))
done
if [ $fails -ne 0 ]; then echo "rendezvous: $fails case(s) failed"; exit 1; fi
echo "rendezvous: all cases passed"
