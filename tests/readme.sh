#!/usr/bin/env bash
# readme.sh: the commands the documentation shows must work, so that it cannot drift from the code.
#
# Runs every ```bash block of README.md and docs/*.md, each as one bash script (set -e) under a timeout,
# in a temporary copy of the repository (its tracked files and the CPU build), so nothing they write
# lands here. A block that cannot run on a CI machine says so in the documentation itself, with one or
# more HTML comments right above its fence, each with a reason in parentheses, printed when it applies:
#   <!-- test: skip (needs a GPU) -->                          the whole block is not run
#   <!-- test: skip lines with "build/gpu-" (needs a GPU) -->  command lines containing the text are dropped
#   <!-- test: replace "A" with "B" (why) -->                  textual replacement before running
#   <!-- test: args "--steps 2" (why) -->                      inserted after every `train_gpt` of the block
#   <!-- test: setup "CMD" (why) -->                           run before the block (e.g. to make an input)
# An unknown directive is an error. Blocks fenced otherwise (```text, plain ```) are output, not commands.
# Also checked: the README's command-line reference equals `train_gpt --help`, and CI's command (.ci/run)
# is the README's test command.
#
# Usage: tests/readme.sh [build/cpu/train_gpt]
# The blocks run as written, with nothing added to their environment, but for one thing a reader would
# type too: as root, README's note makes Open MPI run as root (its `export OMPI_ALLOW_RUN_AS_ROOT...`
# line, taken from README itself and printed).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/cpu/train_gpt}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$BIN" ] || { echo "readme: $BIN not built (make cpu)"; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# the copy: tracked files (or, without git, everything but build/), and the CPU build with its stamp
mkdir -p "$TMP/repo/build"
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$TMP/repo"
else
    tar --exclude=./build -cf - . | tar -xf - -C "$TMP/repo"
fi
cp -p -r build/cpu "$TMP/repo/build/cpu"
[ -f build/flags-cpu.txt ] && cp -p build/flags-cpu.txt "$TMP/repo/build/"

# the command-line reference is the --help text (less its usage line)
"$BIN" --help | tail -n +3 > "$TMP/help.txt"
awk '/^## Command-line reference/ { inside = 1 } inside && /^```/ { if (++fence == 2) exit; next } inside && fence == 1' \
    README.md > "$TMP/readme_help.txt"
if ! diff -u "$TMP/readme_help.txt" "$TMP/help.txt" > "$TMP/help.diff"; then
    cat "$TMP/help.diff"
    echo "readme: FAILED: README's command-line reference differs from train_gpt --help (diff above: - README, + --help)"
    exit 1
fi
echo "ok: README's command-line reference equals train_gpt --help"

# CI runs the README's test command
ci_command=$(grep -v '^\s*#\|^\s*$\|^set \|^cd ' .ci/run | tail -n 1)
grep -q "^$ci_command\( \|$\)" README.md || { echo "readme: FAILED: .ci/run runs '$ci_command', which README.md does not show"; exit 1; }
echo "ok: .ci/run runs the README's test command: $ci_command"

# README's list of what `make test` runs names every test script and make target that run_all.sh runs
listed=$(awk '/^`make test` runs `tests\/run_all.sh`/ { inside = 1 } /^## Build/ { inside = 0 } inside' README.md)
while read -r t; do
    grep -qF -- "$t" <<< "$listed" \
        || { echo "readme: FAILED: tests/run_all.sh runs '$t', which README's list of what make test runs does not name"; exit 1; }
done < <(grep -o '\(scripts\|tests\)/[a-z_0-9/]*\.\(sh\|py\)\|make -C dev/cuda \(-j2 \)\?[a-z][a-z]*' tests/run_all.sh | sed 's/-j2 //' | sort -u)
echo "ok: README's list of what make test runs names every script it runs"

as_root=$(grep -m1 '^export OMPI_ALLOW_RUN_AS_ROOT=' README.md) || { echo "readme: FAILED: README's note for root (export OMPI_ALLOW_RUN_AS_ROOT=...) is missing"; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
    eval "$as_root"
    echo "as root, README's note applies to every block: $as_root"
fi
"$PY" - "$TMP/repo" README.md docs/*.md <<'PYEOF'
import os, re, signal, subprocess, sys, time

repo, files = sys.argv[1], sys.argv[2:]
TIMEOUT = 180  # seconds per block; the slowest shortened block takes about 30 s on 2 busy cores
DIRECTIVE = re.compile(r'<!-- test: (.*) \(([^()]*)\) -->$')

def blocks(path):
    """Yields (line number, directives [(kind, args, reason)], code) of each ```bash block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            directives, j = [], i - 1
            while j >= 0 and lines[j].startswith("<!-- test:"):
                m = DIRECTIVE.match(lines[j].strip())
                if not m:
                    sys.exit(f"readme: {path}:{j + 1}: a test directive needs the form <!-- test: WHAT (REASON) -->")
                directives.insert(0, parse(m.group(1), m.group(2), f"{path}:{j + 1}"))
                j -= 1
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            yield i + 1, directives, "\n".join(lines[i + 1:end])
            i = end
        i += 1

def parse(what, reason, where):
    for kind, pattern in (("skip lines with", r'skip lines with "(.*)"'), ("skip", r'skip'),
                          ("replace", r'replace "(.*)" with "(.*)"'), ("args", r'args "(.*)"'),
                          ("setup", r'setup "(.*)"')):
        m = re.fullmatch(pattern, what)
        if m:
            return kind, m.groups(), reason
    sys.exit(f"readme: {where}: unknown test directive '{what}'")

def logical_lines(code):
    """Joins backslash continuations, so a dropped command goes with all its lines."""
    out, cur = [], ""
    for line in code.split("\n"):
        if line.endswith("\\"):
            cur += line + "\n"
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return out

ran = skipped = failed = 0
for path in files:
    for line, directives, code in blocks(path):
        where = f"{path}:{line}"
        skip = [r for k, a, r in directives if k == "skip"]
        if skip:
            print(f"skipped {where}: {skip[0]}")
            skipped += 1
            continue
        setup = []
        for kind, args, reason in directives:
            if kind == "skip lines with":
                code = "\n".join(l for l in logical_lines(code) if args[0] not in l)
            elif kind == "replace":
                if args[0] not in code:
                    sys.exit(f"readme: {where}: replace \"{args[0]}\": not in the block")
                code = code.replace(args[0], args[1])
            elif kind == "args":
                code = re.sub(r"(train_gpt)(?=[ \n]|$)", r"\1 " + args[0], code)
            elif kind == "setup":
                setup.append(args[0])
            print(f"  {where}: {kind} {' with '.join(repr(a) for a in args)} ({reason})")
        script = "set -eo pipefail\n" + "\n".join(setup) + "\n" + code + "\n"
        first = next((l for l in code.split("\n") if l.strip() and not l.lstrip().startswith("#")), "(empty)")
        t0 = time.time()
        # its own process group, so that a timeout ends what it started too (make, mpirun and the ranks)
        p = subprocess.Popen(["bash", "-c", script], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, errors="replace", start_new_session=True)
        try:
            out, _ = p.communicate(timeout=TIMEOUT)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc = f"timeout after {TIMEOUT} s"
        dt = time.time() - t0
        if rc == 0:
            print(f"ok {where} ({dt:.0f} s): {first.strip()[:100]}")
            ran += 1
        else:
            print(f"FAILED {where} (exit {rc}, {dt:.0f} s), the script was:\n{script}--- its output (last 30 lines):")
            print("\n".join(out.rstrip().split("\n")[-30:]))
            failed += 1
print(f"readme: {ran} blocks ran, {skipped} skipped (reasons above), {failed} failed")
sys.exit(1 if failed else 0)
PYEOF
