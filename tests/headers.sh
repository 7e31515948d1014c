#!/usr/bin/env bash
# headers.sh: every header of llmc/ and of its subfolders compiles on its own, on both targets. For
# each header, a translation unit that includes only that header is compiled:
#   CPU target  $CXX $CPU_FLAGS -fsyntax-only          (g++ -x c++ -DLLMC_CPU, the flags of build/cpu)
#   GPU target  $NVCC $NVCC_FLAGS -c -o /dev/null      (BF16, one architecture; only where nvcc exists)
# So a header includes what it uses, and works wherever it is included first: none leans on what the file
# including it happened to include before it (train_gpt.cu's order, say).
# Usage: make headers            (the Makefile hands over its compilers and flags; about a minute at -j2)
#        bash tests/headers.sh [cpu|gpu]   (run from `make headers` when CPU_FLAGS is not set)
# JOBS (default 2) compiles run at once. Exit 0 when every header compiled on every target checked.
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-all}
if [ -z "${CPU_FLAGS:-}" ]; then  # the flags live in the Makefile: take them from there
    exec make -s headers HEADERS_TARGETS="$WHICH"
fi
JOBS=${JOBS:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mapfile -t HEADERS < <(find llmc -name '*.h' | LC_ALL=C sort)

# check TARGET EXT COMMAND...: compiles one translation unit per header ($TMP/TARGET/<n>.EXT, each holding
# one #include) with COMMAND followed by the file, JOBS at a time; then prints each failure with its messages
check() {
    local target=$1 ext=$2
    shift 2
    local dir="$TMP/$target" i ok=0
    mkdir -p "$dir"
    for i in "${!HEADERS[@]}"; do
        printf '#include "%s/%s"\n' "$PWD" "${HEADERS[$i]}" >"$dir/$i.$ext"
        { "$@" "$dir/$i.$ext" >"$dir/$i.log" 2>&1 && touch "$dir/$i.ok"; } &
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    done
    wait
    for i in "${!HEADERS[@]}"; do
        if [ -e "$dir/$i.ok" ]; then
            ok=$((ok + 1))
            [ -s "$dir/$i.log" ] && { echo "  (warnings) ${HEADERS[$i]} alone:"; sed 's/^/      /' "$dir/$i.log"; }
        else
            echo "  FAIL  ${HEADERS[$i]} does not compile alone:"; sed 's/^/      /' "$dir/$i.log" | head -20
        fi
    done
    if [ "$ok" -eq "${#HEADERS[@]}" ]; then
        echo "  ok    $target target: all $ok headers compile alone"
        return 0
    fi
    echo "  FAIL  $target target: $((${#HEADERS[@]} - ok)) of ${#HEADERS[@]} headers do not compile alone"
    return 1
}

fails=0
if [ "$WHICH" = all ] || [ "$WHICH" = cpu ]; then
    # shellcheck disable=SC2086
    check cpu cpp ${CXX:-g++} $CPU_FLAGS -fsyntax-only || fails=$((fails + 1))
fi
if [ "$WHICH" = all ] || [ "$WHICH" = gpu ]; then
    if [ -n "${NVCC:-}" ] && [ -x "$(command -v "$NVCC" 2>/dev/null || echo "$NVCC")" ]; then
        # shellcheck disable=SC2086
        check gpu cu "$NVCC" $NVCC_FLAGS -x cu -c -o /dev/null || fails=$((fails + 1))
    elif [ "$WHICH" = gpu ]; then
        echo "  FAIL  gpu target: no nvcc (toolchain.mk found none)"; fails=$((fails + 1))
    else
        echo "  (no nvcc: the GPU target's half is left out)"
    fi
fi
[ $fails -eq 0 ] && echo "headers: every header compiles on its own" || echo "headers: some headers need includes of their own"
exit $((fails > 0))
