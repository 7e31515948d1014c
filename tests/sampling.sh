#!/usr/bin/env bash
# sampling.sh: sampling with a prompt, and the C++ GPT-2 encoder that turns the prompt into tokens.
#   1. train_gpt --encode equals scripts/gpt2_tokenizer.py (itself equal to tiktoken's GPT-2 encoding) on
#      the whole default dataset text (The Devil's Dictionary, 384k characters), on tricky strings
#      (contractions, digits, runs of spaces, tabs and newlines, punctuation, non-ASCII), and on every code
#      point of the blocks whose letter/number classes llmc/run/bpe.h claims to be exact. Expected ids come from
#      the Python encoder, never from this file.
#   2. --steps 0 --model FILE --prompt samples once, without training; the sample starts with the prompt;
#      --temperature 0 is greedy (the same whatever the seed), --top-k 1 equals greedy; with the same seed
#      the samples of --tp 2 and --pp 2 (mpirun) equal the single-rank one.
#   3. --temperature 0 gives the argmax sequence of the float64 reference forward (scripts/gpt2_reference.py)
#      of the same model file after the prompt; --steps 0 reads no train data; an end-of-text token prints
#      as a document break (a model made to always pick it), never as its text.
#   4. bad vocabulary files and prompts end in one error line.
# usage: tests/sampling.sh [path/to/train_gpt]
set -u
BIN=${1:-build/cpu/train_gpt}
PY=${PYTHON:-/usr/bin/python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { printf '  ok    %s\n' "$*"; }
fail() { printf '  FAIL  %s\n' "$*"; fails=$((fails + 1)); }

# 1. the encoder against the Python one
"$PY" - "$TMP" <<'PYEOF'
import gzip, sys
d = sys.argv[1]
open(f"{d}/devil.txt", "w", encoding="utf-8").write(gzip.open("/usr/share/dictd/devil.dict.dz").read().decode("utf-8"))
tricky = ["I'm sure you'll see they've done it, 'twas Bob's; he'd say 're 'RE 'S don't",
          "x  y   z    \n\n\n  a\t\tb \t \n", "  leading and trailing  ", "\n", " ", "", "'", "''s",
          "123 4567 89a b12 3.14159 1,000,000 -42 +7", "!!! ?? ... --- (a) [b] {c} <|endoftext|> @#$%^&*",
          "naïve café Ünïcödé — “quoted” ‘single’ … ½ ² ³ ¹ × ÷ 5² 10½", "日本語のテキスト、句読点。 中文，标点！",
          "emoji 😀🎉 👍🏽 ok", "tab\tafter", "  \u00a0 nbsp\u00a0x \u2003em\u3000ideo", "end with spaces   "]
# every code point of the exactly classified blocks, between a letter, a digit and spaces
blocks = [(0x80, 0x370), (0x1680, 0x1681), (0x2000, 0x2C00), (0x3000, 0x3040), (0xFE30, 0xFE70), (0xFF00, 0xFFF0),
          (0x1F000, 0x1FB00)]
for lo, hi in blocks:
    tricky.append("".join("a%c1 %c%c b%c " % (c, c, c, c) for c in range(lo, hi) if not 0xD800 <= c < 0xE000))
open(f"{d}/tricky.txt", "w", encoding="utf-8").write("\n".join(tricky))
PYEOF
for f in devil tricky; do
    timeout 60 "$BIN" --encode "$TMP/$f.txt" >"$TMP/$f.cpp" 2>"$TMP/err" || { fail "encode $f: $(cat "$TMP/err")"; continue; }
    timeout 120 "$PY" -c "
import sys; sys.path.insert(0, 'scripts'); from gpt2_tokenizer import GPT2Tokenizer
print(' '.join(map(str, GPT2Tokenizer().encode(open(sys.argv[1], encoding='utf-8').read()))))" "$TMP/$f.txt" >"$TMP/$f.py"
    if cmp -s "$TMP/$f.cpp" "$TMP/$f.py"; then ok "--encode $f.txt equals gpt2_tokenizer.py ($(wc -w <"$TMP/$f.py") tokens)"
    else fail "--encode $f.txt differs from gpt2_tokenizer.py"; fi
done

# 2. sampling from a model file without training, with a prompt
M=(--layers 2 --channels 32 --heads 2 --max-seq-len 32 --seq-len 32 --batch-size 1 --val-every 0)
timeout 60 "$BIN" "${M[@]}" --steps 0 --sample-every 0 --save-model "$TMP/m.bin" >/dev/null 2>"$TMP/err" \
    || fail "writing a model: $(cat "$TMP/err")"
S=(--steps 0 --model "$TMP/m.bin" --seq-len 32 --batch-size 2 --val-every 0 --sample-len 12)
PROMPT="The devil's dictionary, 2nd edition:"
sample() {  # sample NAME ARGS...: the sample line of a run
    local name=$1
    shift
    timeout 120 "$@" >"$TMP/$name.out" 2>&1 || fail "$name: $(tail -2 "$TMP/$name.out")"
    grep -a '^sample: ' "$TMP/$name.out" >"$TMP/$name.sample" || fail "$name: no sample line"
}
sample one "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5
sample seed6 "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 6
grep -qF "sample: $PROMPT" "$TMP/one.sample" && ok "--steps 0 --model --prompt samples once, starting with the prompt" \
    || fail "the sample does not start with the prompt: $(cat "$TMP/one.sample")"
cmp -s "$TMP/one.sample" "$TMP/seed6.sample" && fail "seeds 5 and 6 sampled the same (temperature 1)" || ok "seeds 5 and 6 differ at temperature 1"
sample greedy5 "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 --temperature 0
sample greedy6 "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 6 --temperature 0
sample topk1 "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 7 --top-k 1 --temperature 3
[ -s "$TMP/greedy5.sample" ] && cmp -s "$TMP/greedy5.sample" "$TMP/greedy6.sample" && cmp -s "$TMP/greedy5.sample" "$TMP/topk1.sample" \
    && ok "--temperature 0 is the same for seeds 5 and 6, and equals --top-k 1" || fail "greedy samples differ"
sample topk40 "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 --top-k 40
cmp -s "$TMP/topk40.sample" "$TMP/one.sample" && fail "--top-k 40 changed nothing" || ok "--top-k 40 changes the sample"
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)
for mode in "--tp 2" "--pp 2"; do
    sample par "${MPIRUN[@]}" "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 $mode
    [ -s "$TMP/one.sample" ] && cmp -s "$TMP/par.sample" "$TMP/one.sample" && ok "$mode samples equal one rank's" \
        || fail "$mode: $(cat "$TMP/par.sample") vs $(cat "$TMP/one.sample")"
    # with temperature and top-k too (logits differ across modes only by rounding, ~1e-7)
    sample par "${MPIRUN[@]}" "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 --temperature 0.8 --top-k 40 $mode
    sample one_tk "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 --temperature 0.8 --top-k 40
    [ -s "$TMP/one_tk.sample" ] && cmp -s "$TMP/par.sample" "$TMP/one_tk.sample" && ok "$mode with --temperature 0.8 --top-k 40 equals one rank" \
        || fail "$mode --temperature 0.8 --top-k 40: $(cat "$TMP/par.sample") vs $(cat "$TMP/one_tk.sample")"
done

# 3. greedy is the argmax sequence of the float64 reference; end of text; sample-only without train data
sample_text() { awk '/^sample:/ { on = 1 } /^done in/ { on = 0 } on' "$1"; }  # every line of the sample
# the reference: greedy decoding with the float64 forward of scripts/gpt2_reference.py after end-of-text
# and the prompt (encoded by scripts/gpt2_tokenizer.py), printed as the trainer prints tokens. A step whose
# best two logits are closer than 1e-5 could flip in float32 (rounding ~1e-6): then it says so instead.
"$PY" - "$TMP/m.bin" "$PROMPT" >"$TMP/ref_greedy.text" <<'PYEOF' || fail "the float64 reference could not decode"
import re, struct, sys
import numpy as np, torch
sys.path.insert(0, "scripts")
import gpt2_reference as ref, gpt2_tokenizer
raw = open(sys.argv[1], "rb").read()
_, _, maxT, V, L, NH, C, Vp = struct.unpack("<8i", raw[:32])
flat = torch.from_numpy(np.frombuffer(raw, "<f4", offset=1024).astype(np.float64))
p, at = {}, 0
for name, shape in ref.param_shapes(V, Vp, maxT, L, NH, C):
    p[name] = flat[at:at + int(np.prod(shape))].view(shape)
    at += int(np.prod(shape))
tok = open("data/gpt2_tokenizer.bin", "rb").read()
eot, pieces, at = struct.unpack("<4i", tok[:16])[3], [], 1024
while at < len(tok):
    pieces.append(tok[at + 1:at + 1 + tok[at]])
    at += 1 + tok[at]
def show(i):  # as tokenizer_print and the document break
    b = pieces[i].split(b"\0")[0]  # a C string: up to its first NUL
    if i == eot: return b"\n--- end of document ---\n"
    if len(b) == 1 and b[0] >= 0x80: return b""  # a lone byte of a split UTF-8 character
    # control characters but newline and tab (and the C1 ones, UTF-8 \xc2\x80-\x9f) as visible escapes
    return re.sub(rb"\xc2[\x80-\x9f]|[\x00-\x08\x0b-\x1f\x7f]", lambda m: b"".join(b"\\x%02x" % c for c in m.group()), b)
seq = [eot] + gpt2_tokenizer.GPT2Tokenizer().encode(sys.argv[2])
out, n_prompt = b"sample: " + b"".join(show(i) for i in seq[1:]), len(seq)
while len(seq) < min(n_prompt + 12, maxT):  # --sample-len 12, cut at --seq-len 32 = maxT
    logits, _ = ref.forward(p, torch.tensor([seq]), torch.tensor([seq]), dict(L=L, NH=NH, V=V))
    top = torch.topk(logits[0, -1], 2)
    if float(top.values[0] - top.values[1]) < 1e-5:
        sys.exit("reference: the best two logits are within 1e-5: inconclusive")
    seq.append(int(top.indices[0]))
    out += show(seq[-1])
sys.stdout.buffer.write(out + b"\n")
PYEOF
sample_text "$TMP/greedy5.out" >"$TMP/greedy5.text"
[ -s "$TMP/ref_greedy.text" ] && cmp -s "$TMP/greedy5.text" "$TMP/ref_greedy.text" \
    && ok "--temperature 0 equals the float64 reference's argmax sequence after the prompt" \
    || fail "--temperature 0 differs from the reference: $(cat "$TMP/greedy5.text") vs $(cat "$TMP/ref_greedy.text")"
sample notrain "$BIN" "${S[@]}" --prompt "$PROMPT" --seed 5 --temperature 0 --train-data "$TMP/none.bin"
cmp -s "$TMP/notrain.sample" "$TMP/greedy5.sample" && ok "--steps 0 does not read the train data (none given: same sample)" \
    || fail "--steps 0 without train data: $(tail -1 "$TMP/notrain.out")"
# end of text: the model with the final LayerNorm's output made its bias u (weight 0) and the end-of-text
# row of wte made u, so logit(eot) = |u|^2 ~ 75 and every other logit ~ 0: p(eot) > 0.999999
"$PY" - "$TMP/m.bin" "$TMP/eot.bin" <<'PYEOF'
import struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
C = struct.unpack("<i", raw[24:28])[0]
w = np.frombuffer(raw, "<f4", offset=1024).copy()
u = np.linspace(1.0, 2.0, C, dtype=np.float32)
w[-2 * C:-C], w[-C:], w[50256 * C:50257 * C] = 0.0, u, u
open(sys.argv[2], "wb").write(raw[:1024] + w.astype("<f4").tobytes())
PYEOF
sample eot "$BIN" "${S[@]}" --model "$TMP/eot.bin" --seed 5
grep -q "^--- end of document ---$" "$TMP/eot.out" && ! grep -q "endoftext" "$TMP/eot.out" \
    && ok "end-of-text prints as a document break, never as <|endoftext|>" || fail "end of text: $(head -c 300 "$TMP/eot.out")"

# 4. errors: one line, exit 1
expect_error() {
    local name=$1 pattern=$2
    shift 2
    timeout 60 "$BIN" "$@" >/dev/null 2>"$TMP/err"
    local rc=$?
    if [ $rc -eq 1 ] && [ "$(grep -c . "$TMP/err")" -eq 1 ] && grep -q "^error: .*$pattern" "$TMP/err"; then ok "$name: $(cat "$TMP/err")"
    else fail "$name: exit $rc, stderr: $(head -3 "$TMP/err")"; fi
}
mkdir -p "$TMP/v"
cp data/vocab.bpe "$TMP/v/"
head -c 100000 data/encoder.json >"$TMP/v/encoder.json"
expect_error "truncated encoder.json" "not a flat JSON object" "${S[@]}" --prompt hi --bpe-dir "$TMP/v"
printf '{"a": 0, "b": 0}' >"$TMP/v/encoder.json"
expect_error "id twice in encoder.json" "token id twice" "${S[@]}" --prompt hi --bpe-dir "$TMP/v"
printf '{"\\u0zz1": 0}' >"$TMP/v/encoder.json"
expect_error "bad escape in encoder.json" "bad .u escape" "${S[@]}" --prompt hi --bpe-dir "$TMP/v"
cp data/encoder.json "$TMP/v/"
printf '#version: 0.2\nĠ t\nzzzzqqqq xx\n' >"$TMP/v/vocab.bpe"
expect_error "merge of unknown tokens" "line 3: a side of the merge" "${S[@]}" --prompt hi --bpe-dir "$TMP/v"
expect_error "no vocabulary folder" "cannot open" "${S[@]}" --prompt hi --bpe-dir "$TMP/none"
expect_error "prompt without samples" "--prompt needs sampling" "${S[@]}" --prompt hi --tokenizer ""
expect_error "prompt too long" "leaves no room" "${S[@]}" --prompt "$(printf 'word %.0s' $(seq 40))"
expect_error "empty prompt" "--prompt is empty" "${S[@]}" --prompt ""
expect_error "negative temperature" "--temperature must be" "${S[@]}" --temperature -1

[ $fails -eq 0 ] && echo "sampling: passed" || { echo "sampling: $fails failure(s)"; exit 1; }
