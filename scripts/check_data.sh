#!/usr/bin/env bash
# check_data.sh: proves that the committed default dataset is reproducible.
#
# It rebuilds data/devil_train.bin, data/devil_val.bin and data/gpt2_tokenizer.bin into a temporary
# folder from The Devil's Dictionary of the Debian package dict-devil, with the very command that made
# them (see data/README.md), and compares each with the committed file byte for byte (cmp).
# Prints PASS or FAIL per file; exits 0 when all three are identical, 1 otherwise.
#
# Usage, from the repository root:   scripts/check_data.sh
# Needs $PYTHON with the module regex (default Debian's /usr/bin/python3, which python3-regex serves; the
# python3 first on PATH may be another Python without Debian's packages) and dict-devil; `make deps`
# (scripts/install_deps.sh) installs both.
set -u

cd "$(dirname "$0")/.." || exit 1      # the repository root, wherever this is started from

PYTHON=${PYTHON:-/usr/bin/python3}
SOURCE=/usr/share/dictd/devil.dict.dz
FILES="devil_train.bin devil_val.bin gpt2_tokenizer.bin"

if [ ! -x "$PYTHON" ]; then
    echo "check_data: $PYTHON not found (Debian package python3; see scripts/install_deps.sh)"
    exit 1
fi
if ! "$PYTHON" -c "import regex" 2>/dev/null; then
    echo "check_data: the Python module 'regex' is missing for $PYTHON (Debian package python3-regex;" \
         "see scripts/install_deps.sh)"
    exit 1
fi
if [ ! -r "$SOURCE" ]; then
    echo "check_data: $SOURCE not found (Debian package dict-devil; see scripts/install_deps.sh)"
    exit 1
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

echo "check_data: rebuilding the default dataset from $SOURCE into $tmp"
if ! "$PYTHON" scripts/prepare_data.py --devil --input "$SOURCE" \
        --out-prefix "$tmp/devil" --write-decode-table "$tmp/gpt2_tokenizer.bin"; then
    echo "FAIL: scripts/prepare_data.py did not run"
    exit 1
fi

status=0
for f in $FILES; do
    if [ ! -f "data/$f" ]; then
        echo "FAIL data/$f (missing)"
        status=1
    elif cmp -s "$tmp/$f" "data/$f"; then
        echo "PASS data/$f"
    else
        echo "FAIL data/$f (differs from the rebuilt file)"
        status=1
    fi
done
exit $status
