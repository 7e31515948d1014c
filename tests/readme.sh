#!/usr/bin/env bash
# readme.sh: the documentation prints what its commands print, so that it cannot drift from the code.
#
# Runs every ```bash block of README.md, docs/*.md and tests/README.md, each as one bash script (set -e)
# under a timeout, in a temporary copy of the repository (its tracked files and the CPU build), so nothing
# they write lands here. The blocks of one file run in order in that one folder: a block may use what an
# earlier block of its file wrote (a model file, a trace).
#
# Output blocks. A ```text block right after a ```bash block (nothing but blank lines between them) shows
# that block's output, stdout and stderr together as a terminal shows them, and is compared with what the
# commands print now; a difference fails, with a unified diff and the block's file:line. The comparison
# ignores trailing spaces and trailing empty lines. A block may show an excerpt:
#   a line `...` (alone on its line)   stands for any number of output lines (none too), so the block's
#                                      other lines must appear in the output in that order, and the lines
#                                      between two `...` lines must follow each other there;
#   a line ending in ` ...`            stands for an output line that begins with the text before ` ...`
#                                      (followed by a space or the line's end), to cut what depends on the
#                                      machine (times, tokens/s) or a long line.
# Without a leading (trailing) `...` line, the block starts (ends) where the output does. A ```text block
# that is not a command's output (a figure), or whose numbers depend on the machine, says so above its
# fence: <!-- test: not compared (REASON) -->. Any other ```text block is an error, and so is one after a
# command block that the test does not run as written (skip, replace, args). Plain ``` fences are
# figures and examples, never compared.
#
# Command blocks. A block that cannot run on a CI machine says so in the documentation itself, with one or
# more HTML comments right above its fence, each with a reason in parentheses, printed when it applies:
#   <!-- test: skip (needs a GPU) -->                          the whole block is not run
#   <!-- test: skip lines with "build/gpu-" (needs a GPU) -->  command lines containing the text are dropped
#   <!-- test: replace "A" with "B" (why) -->                  textual replacement before running
#   <!-- test: args "--steps 2" (why) -->                      inserted after every `train_gpt` of the block
#   <!-- test: setup "CMD" (why) -->                           run before the block (e.g. to make an input)
# An unknown directive is an error. The documentation's commands write into the working folder, never
# into docs/: the test fails if a block changed anything under docs/ in its copy. Every picture the
# documentation shows (![...](path.png)) must exist.
# Also checked: CI's command (.ci/run) is the README's test command, tests/README.md's list of what
# `make test` runs names every test script it runs, and README's code layout names every header of llmc/.
#
# Usage: tests/readme.sh [--update] [--pictures] [build/cpu/train_gpt] [FILE.md ...]
#   FILE.md ...   check these files only, named from the repository's top folder (default: README.md docs/*.md
#                 tests/README.md)
#   --update      rewrite each stale output block in place from what its commands print now (an excerpt
#                 keeps its `...` lines and cuts, each shown line replaced by the output line it stands
#                 for), then report what changed: review it with git diff. This is how the documentation
#                 is regenerated after a change to what the program prints.
#   --pictures    copy each picture a block wrote into the working folder (e.g. `-o pipeline_1f1b.png`)
#                 over the tracked picture of that name that the documentation shows (docs/NAME.png):
#                 `make docs` runs `--update --pictures`.
# The blocks run as written, with nothing added to their environment, but for one thing a reader would
# type too: as root, README's note makes Open MPI run as root (its `export OMPI_ALLOW_RUN_AS_ROOT...`
# line, taken from README itself and printed).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/cpu/train_gpt
MODE=()
FILES=()
for arg in "$@"; do
    case $arg in
        --update|--pictures) MODE+=("$arg") ;;
        -*) echo "readme: unknown option $arg (usage: tests/readme.sh [--update] [--pictures] [BINARY] [FILE.md ...])"; exit 1 ;;
        *.md) [ -f "$arg" ] || { echo "readme: no file $arg"; exit 1; }; FILES+=("$arg") ;;
        *) BIN=$arg ;;
    esac
done
[ ${#FILES[@]} -gt 0 ] || FILES=(README.md docs/*.md $(ls tests/README.md 2>/dev/null))
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

# checks of the documentation's lists, each reported now and failing the test at the end
early=()
# CI runs the README's test command
ci_command=$(grep -v '^\s*#\|^\s*$\|^set \|^cd ' .ci/run | tail -n 1)
if grep -q "^$ci_command\( \|$\)" README.md; then
    echo "ok: .ci/run runs the README's test command: $ci_command"
else
    early+=(".ci/run runs '$ci_command', which README.md does not show")
fi

# tests/README.md's list of what `make test` runs names every test script and make target that run_all.sh runs
listed=$(awk '/^## What `make test` runs/ { inside = 1; next } /^## / { inside = 0 } inside' tests/README.md 2>/dev/null || true)
unlisted=()
while read -r t; do
    grep -qF -- "$t" <<< "$listed" || unlisted+=("$t")
done < <(grep -o '\(scripts\|tests\)/[a-z_0-9/]*\.\(sh\|py\)\|make -C dev/cuda \(-j2 \)\?[a-z][a-z]*' tests/run_all.sh | sed 's/-j2 //' | sort -u)
if [ -z "$listed" ]; then
    early+=("tests/README.md has no section '## What \`make test\` runs'")
elif [ ${#unlisted[@]} -gt 0 ]; then
    early+=("tests/run_all.sh runs ${unlisted[*]}, which tests/README.md's list of what make test runs does not name")
else
    echo "ok: tests/README.md's list of what make test runs names every script it runs"
fi

# README's code layout names every header of llmc/ (and its folders) once, and no header that does not exist
layout=$(awk '/^## Code layout/ { inside = 1; next } /^## / { inside = 0 } inside' README.md |
         grep -o '^| `llmc/[^`]*\.h`' | sed 's/^| `//; s/`$//' | sort)
headers=$(find llmc -name '*.h' | sort)
if [ "$layout" = "$headers" ]; then
    echo "ok: README's code layout names every header of llmc/ once: $(wc -l <<< "$headers") headers"
else
    diff <(echo "$layout") <(echo "$headers") | grep '^[<>]' | sed 's/^</  in README only (or twice):/; s/^>/  not in README:/' || true
    early+=("README's code layout and the headers of llmc/ differ (above)")
fi

as_root=$(grep -m1 '^export OMPI_ALLOW_RUN_AS_ROOT=' README.md) || { echo "readme: FAILED: README's note for root (export OMPI_ALLOW_RUN_AS_ROOT=...) is missing"; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
    eval "$as_root"
    echo "as root, README's note applies to every block: $as_root"
fi
rc=0
"$PY" - "$TMP/repo" "$PWD" "${MODE[*]:-}" "${FILES[@]}" <<'PYEOF' || rc=$?
import difflib, hashlib, os, re, shutil, signal, subprocess, sys, time

repo, here, mode, files = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
UPDATE, PICTURES = "--update" in mode, "--pictures" in mode
TIMEOUT = 180  # seconds per block; the slowest (20 training steps) take about 30 s on 2 busy cores
DIRECTIVE = re.compile(r'<!-- test: (.*) \(([^()]*)\) -->$')
MODIFIERS = ("skip", "skip lines with", "replace", "args")  # a block run otherwise than written: its output is not shown
problems = []  # (where, what): reported at the end, each fails the test

class Block:
    def __init__(self, path, fence, info, directives, body, end):
        self.path, self.fence, self.info, self.directives = path, fence, info, directives
        self.body, self.end = body, end  # body: the lines inside the fences; end: index of the closing fence
        self.output_of = None            # for an output block: the command block it shows the output of
        self.output = None               # for a command block: its compared output block
    where = property(lambda self: f"{self.path}:{self.fence + 1}")
    def has(self, kind):
        return any(k == kind for k, _, _ in self.directives)

def parse_directive(what, reason, where):
    for kind, pattern in (("skip lines with", r'skip lines with "(.*)"'), ("skip", r'skip'),
                          ("replace", r'replace "(.*)" with "(.*)"'), ("args", r'args "(.*)"'),
                          ("setup", r'setup "(.*)"'), ("not compared", r'not compared')):
        m = re.fullmatch(pattern, what)
        if m:
            return kind, m.groups(), reason
    sys.exit(f"readme: {where}: unknown test directive '{what}'")

def blocks(path, lines):
    """The fenced blocks of a file, each with the directives right above it; pairs each ```text block
    with the ```bash block right above it."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith("```"):
            info = lines[i].strip()[3:].strip()
            directives, j = [], i - 1
            while j >= 0 and lines[j].startswith("<!-- test:"):
                m = DIRECTIVE.match(lines[j].strip())
                if not m:
                    sys.exit(f"readme: {path}:{j + 1}: a test directive needs the form <!-- test: WHAT (REASON) -->")
                directives.insert(0, parse_directive(m.group(1), m.group(2), f"{path}:{j + 1}"))
                j -= 1
            end = i + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                sys.exit(f"readme: {path}:{i + 1}: a fence that is never closed")
            b = Block(path, i, info, directives, lines[i + 1:end], end)
            b.first_directive = j + 1
            out.append(b)
            i = end
        i += 1
    for prev, b in zip([None] + out, out):
        kinds = [k for k, _, _ in b.directives]
        if b.info == "text":
            if any(k != "not compared" for k in kinds):
                sys.exit(f"readme: {b.where}: an output block takes only <!-- test: not compared (REASON) -->")
            after_command = prev is not None and prev.info == "bash" and \
                all(not l.strip() for l in lines[prev.end + 1:b.first_directive])
            if b.has("not compared"):
                continue
            if not after_command:
                problems.append((b.where, "an output block with no command block right above it: put the command "
                                 "that prints it there, or mark it <!-- test: not compared (REASON) -->"))
            elif any(prev.has(k) for k in MODIFIERS):
                problems.append((b.where, "an output block after a command block that the test runs otherwise than "
                                 "written (skip, replace, args): mark it <!-- test: not compared (REASON) -->"))
            elif b.body and all(is_gap(l) or not l.strip() for l in b.body):
                problems.append((b.where, "an output block that shows no line of the output"))
            else:
                b.output_of, prev.output = prev, b
        elif "not compared" in kinds:
            sys.exit(f"readme: {b.where}: 'not compared' is for ```text blocks")
    return out

# --- comparing an output block (with its excerpt marks) with an output

def is_gap(line):
    return line.strip() == "..."

def line_matches(shown, actual):
    if shown.endswith(" ...") and not is_gap(shown):
        head = shown[:-4]
        return actual.startswith(head) and (len(actual) == len(head) or actual[len(head)].isspace())
    return shown == actual

def parts(shown):
    """The block as a list of segments (lists of lines) and gaps (None)."""
    out = []
    for line in shown:
        if is_gap(line):
            out.append(None)
        elif out and out[-1] is not None:
            out[-1].append(line)
        else:
            out.append([line])
    return out

def seg_at(seg, out, pos):
    return pos + len(seg) <= len(out) and all(line_matches(s, a) for s, a in zip(seg, out[pos:pos + len(seg)]))

def matches(shown, out):
    ps = parts(shown)
    if not ps:
        return not out
    if None not in ps:
        return len(ps[0]) == len(out) and seg_at(ps[0], out, 0)
    pos = 0
    for i, p in enumerate(ps):
        if p is None:
            continue
        if i == 0:  # anchored at the start
            if not seg_at(p, out, 0):
                return False
            pos = len(p)
        elif i == len(ps) - 1:  # anchored at the end
            return len(out) - len(p) >= pos and seg_at(p, out, len(out) - len(p))
        else:  # the first place after the previous segment (enough for gaps of any length)
            while pos + len(p) <= len(out) and not seg_at(p, out, pos):
                pos += 1
            if pos + len(p) > len(out):
                return False
            pos += len(p)
    return True

def similarity(shown, actual):
    if line_matches(shown, actual):
        return 1.0
    head = shown[:-4] if shown.endswith(" ...") else shown
    return 0.9 * difflib.SequenceMatcher(None, head, actual[:len(head) + 8]).ratio()

def cut_like(shown, actual):
    """The output line as the block shows it: cut after as many words as the shown line's cut keeps."""
    if not (shown.endswith(" ...") and not is_gap(shown)):
        return actual
    words = len(shown[:-4].split())
    m = re.match(r'\s*(\S+\s+){%d}' % max(words - 1, 0) + r'\S+', actual)
    if not m or m.end() >= len(actual.rstrip()):
        return actual
    return actual[:m.end()] + " ..."

def regenerate(shown, out):
    """The block as it should be now: unchanged if it matches; else each segment of an excerpt replaced by
    the output lines most like it, in order (a block without `...` becomes the whole output)."""
    if matches(shown, out):
        return shown
    ps = parts(shown)
    if None not in ps:  # no gap: line for line where the lengths agree, else the whole output
        return [cut_like(a, b) for a, b in zip(shown, out)] if len(shown) == len(out) else out
    new, pos = [], 0
    for i, p in enumerate(ps):
        if p is None:
            new.append("...")
            continue
        k = len(p)
        if i == 0:
            starts = [0]
        elif i == len(ps) - 1:
            starts = [max(len(out) - k, pos)]
        else:
            starts = range(pos, max(len(out) - k, pos) + 1)
        best = max(starts, key=lambda s: sum(similarity(a, b) for a, b in zip(p, out[s:s + k])))
        new += [cut_like(a, b) for a, b in zip(p, out[best:best + k])]
        pos = min(best + k, len(out))
    return new

def clean(text_lines):
    lines = [l.rstrip() for l in text_lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines

# --- running the command blocks

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

def tree_digest(folder):
    digest = {}
    for root, _, names in os.walk(folder):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                digest[os.path.relpath(p, repo)] = hashlib.sha256(f.read()).hexdigest()
    return digest

def pictures_in_folder():
    return {n: os.stat(os.path.join(repo, n)).st_mtime_ns for n in os.listdir(repo) if n.endswith(".png")}

t_start = time.time()
docs_before = tree_digest(os.path.join(repo, "docs"))
ran = skipped = failed = compared = stale = rewritten = 0
pictures = {}  # picture name -> the block that wrote it into the working folder
for path in files:
    text = open(path, encoding="utf-8").read()
    lines = text.split("\n")
    replacements = []  # (first body line, closing fence line, new body) of each stale block, for --update
    for b in blocks(path, lines):
        if b.info != "bash":
            continue
        code = "\n".join(b.body)
        if b.has("skip"):
            print(f"skipped {b.where}: {next(r for k, a, r in b.directives if k == 'skip')}")
            skipped += 1
            continue
        setup = []
        for kind, args, reason in b.directives:
            if kind == "skip lines with":
                code = "\n".join(l for l in logical_lines(code) if args[0] not in l)
            elif kind == "replace":
                if args[0] not in code:
                    sys.exit(f"readme: {b.where}: replace \"{args[0]}\": not in the block")
                code = code.replace(args[0], args[1])
            elif kind == "args":
                code = re.sub(r"(train_gpt)(?=[ \n]|$)", r"\1 " + args[0], code)
            elif kind == "setup":
                setup.append(args[0])
            print(f"  {b.where}: {kind} {' with '.join(repr(a) for a in args)} ({reason})")
        script = "set -eo pipefail\n" + "\n".join(setup) + "\n" + code + "\n"
        first = next((l for l in code.split("\n") if l.strip() and not l.lstrip().startswith("#")), "(empty)")
        pictures_before = pictures_in_folder()
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
        for name, mtime in pictures_in_folder().items():
            if pictures_before.get(name) != mtime:
                pictures[name] = b.where
        if rc != 0:
            print(f"FAILED {b.where} (exit {rc}, {dt:.0f} s), the script was:\n{script}--- its output (last 30 lines):")
            print("\n".join(out.rstrip().split("\n")[-30:]))
            failed += 1
            continue
        ran += 1
        if b.output is None:
            print(f"ok {b.where} ({dt:.0f} s): {first.strip()[:100]}")
            continue
        o = b.output
        shown, now = clean(o.body), clean(out.split("\n"))
        compared += 1
        if matches(shown, now):
            print(f"ok {b.where} ({dt:.0f} s), its output as {o.where} shows: {first.strip()[:80]}")
            continue
        stale += 1
        new = regenerate(shown, now)
        if not matches(new, now):  # (an excerpt whose marks no longer fit the output)
            new = now
        excerpt = ", as the block would show it" if any(is_gap(l) or l.endswith(" ...") for l in shown) else ""
        print(f"DIFFERS {o.where}: the output of {b.where} ({first.strip()[:80]}) is not what the block shows "
              f"(- the block, + the output now{excerpt}):")
        sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(
            shown, new, f"{o.where} (the block)", "(the commands' output now)", lineterm="", n=2))
        replacements.append((o.fence + 1, o.end, new))
    if UPDATE and replacements:
        if open(path, encoding="utf-8").read() != text:
            problems.append((path, "changed while its blocks ran: not updated (run --update again)"))
            continue
        for first_line, end, new in sorted(replacements, reverse=True):
            lines[first_line:end] = new
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        os.replace(path + ".tmp", path)
        rewritten += len(replacements)
        print(f"updated {path}: {len(replacements)} output block(s) rewritten")

# nothing under docs/ changed: the documentation's commands write into the working folder
docs_after = tree_digest(os.path.join(repo, "docs"))
for name in sorted(set(docs_before) | set(docs_after)):
    if docs_before.get(name) != docs_after.get(name):
        problems.append((name, "a block wrote into docs/ (the documentation's commands write into the working "
                         "folder; make docs updates the pictures in docs/)"))

# every picture shown exists; with --pictures, the pictures the blocks drew replace the tracked ones
for path in files:
    for n, line in enumerate(open(path, encoding="utf-8").read().split("\n")):
        for ref in re.findall(r'!\[[^\]]*\]\(([^)\s]+\.png)\)', line):
            tracked = os.path.normpath(os.path.join(os.path.dirname(path), ref))
            name = os.path.basename(ref)
            if PICTURES and name in pictures:
                shutil.copyfile(os.path.join(repo, name), os.path.join(here, tracked))
                print(f"picture {tracked}: drawn by the block at {pictures[name]}")
            elif PICTURES:
                print(f"picture {tracked}: no block of {', '.join(files)} drew {name}; left as it is")
            if not os.path.isfile(os.path.join(here, tracked)):
                problems.append((f"{path}:{n + 1}", f"shows the picture {ref}, which does not exist "
                                 f"(make docs draws the pictures)"))

for where, what in problems:
    print(f"FAILED {where}: {what}")
print(f"readme: {ran} blocks ran, {skipped} skipped (reasons above), {failed} failed; "
      f"{time.time() - t_start:.0f} s")
if UPDATE:
    print(f"readme: {compared} output blocks compared, {rewritten} rewritten from the commands' output "
          f"(review them: git diff)")
else:
    print(f"readme: {compared} output blocks compared, " +
          ("all identical" if not stale else f"{stale} differ (diffs above; bash tests/readme.sh --update FILE "
                                             f"rewrites them)"))
sys.exit(1 if failed or problems or (stale and not UPDATE) else 0)
PYEOF
for e in "${early[@]}"; do
    echo "readme: FAILED: $e"
    rc=1
done
exit $rc
