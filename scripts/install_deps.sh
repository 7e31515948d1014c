#!/usr/bin/env bash
# install_deps.sh: installs what this repository needs on a fresh Debian 12 machine, and nothing when
# everything is already there (safe to run again: it only installs the packages that are missing).
#
#   g++ make                      build the CPU target (the GPU target also needs the CUDA toolkit,
#                                 which is not a Debian 12 package and is not installed here)
#   openmpi-bin libopenmpi-dev    mpirun and MPI headers, for multi-rank runs
#   python3 python3-regex         data preparation and the GPT-2 tokenizer (scripts/prepare_data.py)
#   python3-torch python3-numpy   the PyTorch reference (scripts/), run on the CPU
#   python3-matplotlib            pipeline timelines (scripts/plot_trace.py)
#   dict-devil                    The Devil's Dictionary, source of the default dataset in data/
#
# Usage: scripts/install_deps.sh [--dry-run]     (--dry-run: report what is missing, install nothing)
# Runs apt-get as root, through sudo when not root already.
set -euo pipefail

PACKAGES=(g++ make python3 python3-regex python3-torch python3-numpy python3-matplotlib dict-devil openmpi-bin libopenmpi-dev)

dry_run=0
case "${1:-}" in
    "") ;;
    --dry-run) dry_run=1 ;;
    *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac

if ! command -v dpkg >/dev/null 2>&1; then
    echo "install_deps: dpkg not found: this script is for Debian (12) and its derivatives" >&2
    exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
    # dpkg -s also knows removed packages whose config files remain, so check the status line
    if dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed$'; then
        echo "install_deps: $p is installed"
    else
        echo "install_deps: $p is missing"
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "install_deps: all packages present, nothing to do"
    exit 0
fi
if [ $dry_run -eq 1 ]; then
    echo "install_deps: would install: ${missing[*]}"
    exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_deps: not root and sudo not found; as root run: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    as_root=(sudo)
fi

echo "install_deps: apt-get update"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
echo "install_deps: apt-get install ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
echo "install_deps: done"
