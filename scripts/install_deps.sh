#!/usr/bin/env bash
# install_deps.sh: what this repository needs, checked by what it is for (a command on PATH, a Python
# module of $PYTHON, a file), and installed on Debian 12 and its derivatives through apt-get.
#
#   need                                 Debian 12 package    for
#   g++, make                            g++ make             the CPU target (the GPU target also needs the
#                                                             CUDA toolkit, not a Debian 12 package)
#   mpirun, mpicxx                       openmpi-bin          multi-rank runs, and MPI in the build
#                                        libopenmpi-dev
#   OpenBLAS's cblas.h, OpenMP build     libopenblas-openmp-  the CPU target's matmuls (without it they run
#   (/usr/include/*/openblas-openmp/)    dev                  on the slower reference GEMM)
#   $PYTHON and its modules regex,       python3 python3-regex data preparation and the tokenizer, the
#   torch, numpy, matplotlib             python3-torch        PyTorch reference (on the CPU), pipeline
#                                        python3-numpy        timelines (scripts/plot_trace.py)
#                                        python3-matplotlib
#   /usr/share/dictd/devil.dict.dz       dict-devil           the source of the default dataset in data/
#   clang++ and its libFuzzer runtime    clang                the fuzz harnesses of the file readers (tests/fuzz/)
#                                        libclang-rt-14-dev
#
# Usage: scripts/install_deps.sh           (`make deps`) install what is missing: apt-get as root, through
#                                          sudo when not root; elsewhere than Debian, say what to install
#        scripts/install_deps.sh --check   (what `make test` runs first) report what is missing, install
#                                          nothing; exit 1 naming `make deps` if anything is
# PYTHON is the Python every script runs with, /usr/bin/python3 unless set (Debian's python3-* packages
# install into that one; for another Python, install its modules with its own tools).
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}
DEVIL=/usr/share/dictd/devil.dict.dz

mode=install
case "${1:-}" in
    "") ;;
    --check) mode=check ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# Fills MISSING with one "debian-package|what it is" entry per missing need.
find_missing() {
    MISSING=()
    local cmd pkg
    for cmd in g++:g++ make:make mpirun:openmpi-bin mpicxx:libopenmpi-dev; do
        pkg=${cmd#*:}
        command -v "${cmd%%:*}" >/dev/null 2>&1 || MISSING+=("$pkg|${cmd%%:*} (command)")
    done
    if [ ! -x "$PYTHON" ]; then
        if [ "$PYTHON" = /usr/bin/python3 ]; then
            MISSING+=("python3|Python 3 at $PYTHON (or set PYTHON)")
            for m in regex torch numpy matplotlib; do MISSING+=("python3-$m|the Python module $m"); done
        else
            MISSING+=("|PYTHON=$PYTHON, not an executable")
        fi
    else
        # one interpreter start for all four modules (importing torch takes a second or two)
        local absent
        absent=$("$PYTHON" - <<'PYEOF'
import importlib
for m in ("regex", "torch", "numpy", "matplotlib"):
    try:
        importlib.import_module(m)
    except Exception:
        print(m)
PYEOF
        ) || absent="regex torch numpy matplotlib"
        for m in $absent; do
            if [ "$PYTHON" = /usr/bin/python3 ]; then MISSING+=("python3-$m|the Python module $m for $PYTHON")
            else MISSING+=("|the Python module $m for $PYTHON ($PYTHON -m pip install $m)"); fi
        done
    fi
    [ -r "$DEVIL" ] || MISSING+=("dict-devil|The Devil's Dictionary, $DEVIL")
    # (the OpenMP build, where toolchain.mk looks: it shares the trainer's threads)
    compgen -G "/usr/include/*/openblas-openmp/cblas.h" >/dev/null \
        || MISSING+=("libopenblas-openmp-dev|OpenBLAS for the CPU matmuls, /usr/include/<triplet>/openblas-openmp/cblas.h")
    if ! command -v clang++ >/dev/null 2>&1; then
        # (the runtimes are only Recommended by clang's packages, which make deps does not install)
        MISSING+=("clang|clang++ (command, for tests/fuzz/)" "libclang-rt-14-dev|clang's libFuzzer and sanitizer runtimes (for tests/fuzz/)")
    elif [ ! -f "$(clang++ -print-file-name="libclang_rt.fuzzer-$(uname -m).a")" ]; then
        MISSING+=("libclang-rt-14-dev|clang's libFuzzer and sanitizer runtimes (for tests/fuzz/)")
    fi
    return 0
}

report() {  # prints each missing need, and the Debian packages that provide them
    local entry
    for entry in "${MISSING[@]}"; do
        local pkg=${entry%%|*}
        echo "install_deps: missing: ${entry#*|}${pkg:+ (Debian: $pkg)}"
    done
}

# the Debian packages of the missing needs (Python modules of another PYTHON have none)
packages() { local entry; for entry in "${MISSING[@]}"; do [ -z "${entry%%|*}" ] || printf '%s ' "${entry%%|*}"; done; }

find_missing
if [ ${#MISSING[@]} -eq 0 ]; then
    echo "install_deps: everything is present (Python: $PYTHON)"
    exit 0
fi
report

if [ $mode = check ]; then
    if [ -n "$(packages)" ]; then
        echo "install_deps: run \`make deps\` first (it installs $(packages)with apt-get, through sudo when" \
             "not root), or install them yourself"
    else
        echo "install_deps: install them first (see above)"
    fi
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
    echo "install_deps: no apt-get here (not Debian), so nothing was installed; with your system's tools install:"
    echo "install_deps:   a C++17 compiler with OpenMP (g++) and make; Open MPI with its compiler wrapper (mpirun, mpicxx);"
    echo "install_deps:   OpenBLAS built with OpenMP (then make cpu BLAS_CFLAGS=-I<its include> BLAS_LIBS=\"-L<its lib> -lopenblas\");"
    echo "install_deps:   for $PYTHON (or set PYTHON): the modules regex, torch (CPU is enough), numpy, matplotlib;"
    echo "install_deps:   The Devil's Dictionary as $DEVIL (only scripts/check_data.sh needs it);"
    echo "install_deps:   clang++ with its libFuzzer and sanitizer runtimes (only tests/fuzz/ needs them)"
    exit 1
fi
read -r -a pkgs <<< "$(packages)"
if [ ${#pkgs[@]} -eq 0 ]; then
    echo "install_deps: nothing apt-get can install (see above)"
    exit 1
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_deps: not root and sudo not found; as root run: apt-get install ${pkgs[*]}"
        exit 1
    fi
    as_root=(sudo)
fi
echo "install_deps: apt-get update"
# (retries: a mirror's passing network error should not fail a fresh machine's setup)
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=5 update
echo "install_deps: apt-get install ${pkgs[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=5 install -y --no-install-recommends "${pkgs[@]}"

find_missing
if [ ${#MISSING[@]} -ne 0 ]; then
    report
    echo "install_deps: still missing after apt-get install (see above)"
    exit 1
fi
echo "install_deps: done, everything is present"
