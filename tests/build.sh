#!/usr/bin/env bash
# build.sh: the build itself (Makefile, dev/cuda/Makefile, toolchain.mk) and the GPU binary on a
# machine without a GPU.
#   1. Without nvcc (NVCC= given, or none on PATH nor in CUDA_HOME), `make gpu` and `make -C dev/cuda`
#      stop with one `error:` line and a non-zero exit, having built nothing.
#   2. Each make prints once what it found (nvcc, NCCL, MPI).
#   3. Flags stamps: outputs rebuild when their compiler or flags change (MPI "installed" after a first
#      build, NCCL_HOME given, another GPU_ARCH), and only then; a NCCL_HOME without nccl.h is an error.
#   4. Given GPU binaries on a machine without a usable GPU: one `error: no GPU: ...` line, exit code 1,
#      also where the loader's cache does not list the CUDA libraries (ld.so --inhibit-cache, as in a
#      container without them on the loader path: the binaries find them through their run path).
# Parts 1-3 run the Makefiles in a temporary copy of the sources with a stand-in compiler that only logs
# its command line and creates its -o file, so they take seconds and need neither g++ nor nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

fail() { echo "build: FAILED: $*"; exit 1; }
mkdir -p "$TMP/repo/dev" "$TMP/cuda/bin" "$TMP/nccl/include" "$TMP/nccl/lib" "$TMP/no-nccl" "$TMP/bin"
cp Makefile train_gpt.cu test_gpt.cu "$TMP/repo/"
cp toolchain.mk "$TMP/repo/"
cp -r llmc "$TMP/repo/llmc"
cp -r dev/cuda "$TMP/repo/dev/cuda"
cp -r dev/emulate "$TMP/repo/dev/emulate"
rm -rf "$TMP/repo/dev/cuda/build" "$TMP/repo/dev/emulate/build"
touch "$TMP/nccl/include/nccl.h"

# the stand-in compiler: appends its arguments to compiled.log and creates the output; asked with
# --dryrun (toolchain.mk, for the toolkit's folder), it answers as nvcc does, compiling nothing
cat > "$TMP/cuda/bin/nvcc" <<EOF
#!/bin/sh
case " \$* " in *" --dryrun "*) echo "#\\$ TOP=$TMP/cuda/bin/.." >&2; exit 0;; esac
out=""; prev=""
for a in "\$@"; do [ "\$prev" = "-o" ] && out=\$a; prev=\$a; done
echo "\$*" >> "$TMP/compiled.log"
: > "\$out"
EOF
chmod +x "$TMP/cuda/bin/nvcc"
FAKE=$TMP/cuda/bin/nvcc

# make as a user would type it: not as a sub-make of `make test` (whose MAKELEVEL hides the summary)
mk() { (cd "$TMP/repo" && env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make "$@") > "$TMP/out" 2> "$TMP/err"; }
compiled() { [ -f "$TMP/compiled.log" ] && wc -l < "$TMP/compiled.log" || echo 0; }
expect_compiles() {  # N then make args: make must compile exactly N files
    local n=$1; shift
    rm -f "$TMP/compiled.log"
    mk "$@" || { cat "$TMP/out" "$TMP/err"; fail "make $* failed"; }
    [ "$(compiled)" -eq "$n" ] || { cat "$TMP/out"; fail "make $*: compiled $(compiled) files, expected $n"; }
    echo "ok: make $* -> $n compiled"
}
expect_error() {  # message then make args: make must fail with that one error line and build nothing
    local msg=$1; shift
    rm -f "$TMP/compiled.log"
    if mk "$@"; then fail "make $* succeeded without nvcc"; fi
    grep -q "^error: $msg" "$TMP/err" || { cat "$TMP/err"; fail "make $*: no 'error: $msg' line"; }
    [ "$(grep -c '^error:' "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "make $*: more than one error line"; }
    [ "$(compiled)" -eq 0 ] || fail "make $* ran the compiler"
    if ls "$TMP"/repo/build/gpu-*/* "$TMP"/repo/dev/cuda/build/[a-z]*_* >/dev/null 2>&1; then fail "make $* left binaries"; fi
    echo "ok: make $* fails: $(grep '^error:' "$TMP/err")"
}

echo "== 1. no nvcc"
expect_error "nvcc not found" gpu NVCC=
expect_error "nvcc not found" -C dev/cuda NVCC=
# PATH without any folder that holds an nvcc, and a CUDA_HOME without one
NO_NVCC_PATH=$(printf '%s' "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || printf '%s:' "$d"; done)
PATH=${NO_NVCC_PATH%:} expect_error "nvcc not found" gpu CUDA_HOME="$TMP/no-cuda"
PATH=${NO_NVCC_PATH%:} expect_error "nvcc not found" -C dev/cuda CUDA_HOME="$TMP/no-cuda"
expect_error "NVCC=$TMP/no-such-nvcc is not an executable" gpu NVCC="$TMP/no-such-nvcc"

echo "== 2. the toolchain summary, once"
mk cpu CXX="$FAKE" NVCC="$FAKE" || fail "make cpu failed"
for what in "nvcc $FAKE" "NCCL " "MPI  " "BLAS "; do
    [ "$(grep -c "^toolchain: $what" "$TMP/out")" -eq 1 ] || { cat "$TMP/out"; fail "summary line 'toolchain: $what' not printed once"; }
done
echo "ok: $(grep -c '^toolchain:' "$TMP/out") summary lines"
# an nvcc on PATH that is a wrapper script outside the toolkit (as /usr/local/bin/nvcc may be): the
# toolkit's headers (cublasLt.h for the emulated build, nccl.h) are still found, in the folder nvcc names
mkdir -p "$TMP/wrap/bin" "$TMP/cuda/include"
printf '#!/bin/sh\nexec %s "$@"\n' "$FAKE" > "$TMP/wrap/bin/nvcc"
chmod +x "$TMP/wrap/bin/nvcc"
touch "$TMP/cuda/include/nccl.h"
mk -n emulated NVCC="$TMP/wrap/bin/nvcc" || { cat "$TMP/err"; fail "make -n emulated failed"; }
grep -q "^toolchain: NCCL $TMP/cuda/include/nccl.h" "$TMP/out" || { cat "$TMP/out"; fail "nvcc wrapper: the toolkit's nccl.h is not found"; }
grep -q -- "-I$TMP/cuda/include" "$TMP/out" || { cat "$TMP/out"; fail "nvcc wrapper: the emulated build does not include the toolkit's headers"; }
rm "$TMP/cuda/include/nccl.h"
echo "ok: an nvcc wrapper outside the toolkit: its headers are found"

echo "== 3. flags stamps"
NO_MPI=(MPI_CFLAGS= MPI_LIBS=)
MPI=(MPI_CFLAGS=-I/opt/mpi/include "MPI_LIBS=-L/opt/mpi/lib -lmpi")
expect_compiles 2 cpu CXX="$FAKE" "${NO_MPI[@]}"
expect_compiles 0 cpu CXX="$FAKE" "${NO_MPI[@]}"
expect_compiles 2 cpu CXX="$FAKE" "${MPI[@]}"      # MPI installed after the first build
grep -q -- "-DUSE_MPI" "$TMP/compiled.log" || fail "the rebuild after MPI appeared has no -DUSE_MPI"
expect_compiles 0 cpu CXX="$FAKE" "${MPI[@]}"
expect_compiles 6 gpu NVCC="$FAKE" "${MPI[@]}"
if [ ! -f /usr/include/nccl.h ]; then  # (Debian's libnccl-dev would be found there)
    grep -q -- "-DNO_NCCL" "$TMP/compiled.log" || fail "no nccl.h was found, yet the GPU build lacks -DNO_NCCL"
fi
expect_compiles 0 gpu NVCC="$FAKE" "${MPI[@]}"
expect_compiles 6 gpu NVCC="$FAKE" "${MPI[@]}" NCCL_HOME="$TMP/nccl"
grep -q -- "-I$TMP/nccl/include" "$TMP/compiled.log" && grep -q -- "-L$TMP/nccl/lib" "$TMP/compiled.log" \
    && ! grep -q -- "-DNO_NCCL" "$TMP/compiled.log" || fail "NCCL_HOME's include and lib are not used"
grep -q "^toolchain: NCCL $TMP/nccl/include/nccl.h" "$TMP/out" || fail "the summary does not show NCCL_HOME's nccl.h"
expect_compiles 0 gpu NVCC="$FAKE" "${MPI[@]}" NCCL_HOME="$TMP/nccl"
expect_error "NCCL_HOME=$TMP/no-nccl has no include/nccl.h" gpu NVCC="$FAKE" "${MPI[@]}" NCCL_HOME="$TMP/no-nccl"
rm -rf "$TMP/repo/build/gpu-"*
KERNELS=$(ls dev/cuda/*.cu | wc -l)  # one binary per kernel file
expect_compiles "$KERNELS" -C dev/cuda NVCC="$FAKE"
expect_compiles 0 -C dev/cuda NVCC="$FAKE"
expect_compiles "$KERNELS" -C dev/cuda NVCC="$FAKE" GPU_ARCH="-gencode arch=compute_89,code=sm_89"

echo "== 4. GPU binaries without a usable GPU"
if nvidia-smi -L >/dev/null 2>&1; then
    echo "skipped: this machine has a GPU"
else
    ran=0
    LOADER=
    for l in /lib64/ld-linux-x86-64.so.2 /lib/ld-linux-aarch64.so.1; do [ -x "$l" ] && LOADER=$l; done
    for bin in "$ROOT"/build/gpu-*/train_gpt "$ROOT"/build/gpu-*/test_gpt "$ROOT"/dev/cuda/build/adamw; do
        [ -x "$bin" ] || continue
        for how in "" ${LOADER:+"$LOADER --inhibit-cache"}; do
            rc=0
            (cd "$TMP" && timeout 60 $how "$bin" > "$TMP/out" 2> "$TMP/err") || rc=$?
            [ $rc -eq 1 ] || { cat "$TMP/err"; fail "${how:+$how }$bin exited $rc without a GPU, expected 1"; }
            [ "$(wc -l < "$TMP/err")" -eq 1 ] && grep -q "^error: no GPU: " "$TMP/err" \
                || { cat "$TMP/err"; fail "${how:+$how }$bin: expected one 'error: no GPU: ...' line"; }
            echo "ok: ${how:+$how }${bin#"$ROOT"/}: $(cat "$TMP/err")"
        done
        ran=$((ran + 1))
    done
    [ $ran -gt 0 ] || echo "skipped: no GPU binaries were built (no nvcc)"
fi

echo "== 5. dependencies: checked by make test, installed by make deps"
# PATH folders made of links to /usr/bin's commands, less some: without g++, and also without apt-get
mkdir -p "$TMP/stubs" "$TMP/no-gxx" "$TMP/no-apt"
cp -rs /usr/bin/. "$TMP/no-gxx/" 2>/dev/null || true
rm -f "$TMP/no-gxx/g++"
cp -rs /usr/bin/. "$TMP/no-apt/" 2>/dev/null || true
rm -f "$TMP/no-apt/g++" "$TMP/no-apt/apt-get" "$TMP/no-apt/dpkg"
cat > "$TMP/stubs/apt-get" <<EOF
#!/bin/sh
echo "apt-get \$*" >> "$TMP/installs.log"
EOF
cat > "$TMP/stubs/sudo" <<EOF
#!/bin/sh
echo "sudo \$*" >> "$TMP/installs.log"
exec "\$@"
EOF
chmod +x "$TMP/stubs/apt-get" "$TMP/stubs/sudo"
deps() {  # PATH then install_deps.sh arguments; output in $TMP/out, exit code in $rc
    rm -f "$TMP/installs.log"; rc=0
    PATH=$1 bash scripts/install_deps.sh "${@:2}" > "$TMP/out" 2>&1 || rc=$?
}
installs() { if [ -f "$TMP/installs.log" ]; then cat "$TMP/installs.log"; fi; }

deps "$TMP/stubs:$TMP/no-gxx" --check
[ $rc -eq 1 ] && grep -q "missing: g++ (command) (Debian: g++)" "$TMP/out" && grep -q "make deps" "$TMP/out" \
    && [ -z "$(installs)" ] || { cat "$TMP/out"; installs; fail "--check did not report g++ and stop without installing"; }
echo "ok: install_deps.sh --check without g++: exit 1: $(tail -n 1 "$TMP/out")"

rm -f "$TMP/installs.log"; rc=0
(PATH="$TMP/stubs:$TMP/no-gxx" timeout 120 env -u MAKELEVEL -u MAKEFLAGS -u MFLAGS make test) > "$TMP/out" 2>&1 || rc=$?
[ $rc -ne 0 ] && grep -q "missing: g++" "$TMP/out" && [ -z "$(installs)" ] \
    || { tail -n 20 "$TMP/out"; fail "make test without g++ did not stop at the dependency check"; }
echo "ok: make test without g++ stops (exit $rc) at the dependency check, installing nothing"

deps "$TMP/stubs:$TMP/no-gxx"
[ $rc -eq 1 ] && installs | grep -q "^apt-get .*install -y --no-install-recommends g++$" && grep -q "still missing after apt-get install" "$TMP/out" \
    || { cat "$TMP/out"; installs; fail "make deps did not apt-get install g++"; }
echo "ok: install_deps.sh without g++ ran: $(installs | grep -c '^apt-get') apt-get calls, the last: $(installs | tail -n 1)"

deps "$TMP/no-apt"
[ $rc -eq 1 ] && grep -q "no apt-get here" "$TMP/out" && grep -q "missing: g++" "$TMP/out" \
    || { cat "$TMP/out"; fail "without apt-get, install_deps.sh did not say what to install"; }
echo "ok: without apt-get: exit 1, saying what to install in $(grep -c '^install_deps:' "$TMP/out") lines"
ln -s /usr/bin/g++ "$TMP/no-apt/g++"
deps "$TMP/no-apt"
[ $rc -eq 0 ] || { cat "$TMP/out"; fail "without apt-get but with everything present, install_deps.sh failed"; }
echo "ok: without apt-get, nothing missing: exit 0: $(cat "$TMP/out")"

echo "== 6. one Python for every script"
for f in scripts/*.py tests/*.py; do
    [ "$(head -n 1 "$f")" = "#!/usr/bin/python3" ] || fail "$f starts with '$(head -n 1 "$f")', not #!/usr/bin/python3"
done
if grep -n "env python\|command -v python3" Makefile toolchain.mk scripts/*.sh scripts/*.py tests/*.sh tests/*.py tests/fuzz/*.sh .ci/run \
    | grep -v "^tests/build.sh:"; then
    fail "a script finds Python on PATH instead of through PYTHON (default /usr/bin/python3)"
fi
printf '#!/bin/sh\necho "the python3 on PATH was used" >&2; exit 1\n' > "$TMP/stubs/python3"
chmod +x "$TMP/stubs/python3"
cat > "$TMP/trace.json" <<'EOF'
{"traceEvents": [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "rank 0"}},
 {"ph": "X", "pid": 0, "tid": 0, "cat": "forward", "name": "F 0", "ts": 0, "dur": 5}]}
EOF
PATH="$TMP/stubs:$PATH" scripts/plot_trace.py "$TMP/trace.json" -o "$TMP/trace.png" > "$TMP/out" 2>&1 && [ -s "$TMP/trace.png" ] \
    || { cat "$TMP/out"; fail "scripts/plot_trace.py did not run with a python3 on PATH that lacks matplotlib"; }
echo "ok: every scripts/*.py and tests/*.py starts with #!/usr/bin/python3; plot_trace.py ran with a python3 on PATH that fails"
echo "build: passed"
