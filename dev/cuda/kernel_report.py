#!/usr/bin/python3
"""kernel_report.py: what the trainer's GPU kernels cost, seen without a GPU (`make -C dev/cuda report`).

A GPU run is the truth about speed; this is the view a machine without a GPU has. It compiles the GPU
target (train_gpt.cu) for one architecture and precision (sm_90, BF16 by default: the H100 build) twice,
once to object code with `--resource-usage` (ptxas reports each kernel's registers, spills, stack, static
shared memory) and once to PTX (the kernel's instructions before ptxas schedules them), and prints:

1. per kernel: threads per block (from its __launch_bounds__, in the PTX as .maxntid), registers, spill
   bytes, static and dynamic shared memory, and the resulting blocks and warps per SM on an H100
   (65,536 registers, 228 KiB of shared memory, 2,048 threads, 32 blocks per SM; --arch sm_80: an A100,
   164 KiB), with what limits them;
2. for the flash-attention kernels and the classifier, the instruction mix of the inner loop (the
   smallest loop of the PTX holding the most mma, or for the classifier the most ex2): mma, ldmatrix,
   cp.async, ex2, loads/stores, conversions and moves, compares/branches/barriers/shuffles, and the
   remaining float and integer (mostly address) arithmetic; instructions per mma is the number to push down;
3. per kernel at GPT-2 124M, B=16, T=1024: the fewest bytes each must move and the FLOPs it must do in
   one training step, and the floor in microseconds at an H100's practical 3.0 TB/s and 790 TFLOP/s
   (large BF16 cuBLAS matmuls), next to the cuBLAS matmuls' floor: a kernel timed later has a floor to be
   compared with (BF16 and FP16 builds).

The minimum bytes are each input read once and each output written once (a read-modify-write counts
twice); FLOPs count multiply-adds as two. Calls per step are those of the fast path (--fused-kernels 1
--attention flash) or, for the kernels only the classic path uses, of that path: the "path" column says.
"fallbk": a --fused-kernels kernel that runs only where the fused one cannot (cuBLASLt's epilogue with
--recompute or where it offers no algorithm; a one-pass kernel where rows are not 16-byte aligned);
"(epilogue ...)": the bytes an epilogue adds to its product.
dev/cuda/README.md explains how to read the report.

usage: kernel_report.py [--nvcc NVCC] [--arch sm_90] [--precision bf16|fp16|fp32] [--keep DIR]
"""
import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Per SM (cuda_occupancy.h's rules): registers are allocated per warp in units of 256 from each of the 4
# sub-partitions' quarter of the register file; each block also holds 1 KiB of shared memory for the
# system. The H100 (sm_90) and the A100 (sm_80), the two architectures the trainer builds for.
SMS = {
    "sm_90": dict(gpu="H100", regs=65536, reg_unit=256, smem=228 * 1024, smem_reserved=1024, smem_unit=128, threads=2048, blocks=32),
    "sm_80": dict(gpu="A100", regs=65536, reg_unit=256, smem=164 * 1024, smem_reserved=1024, smem_unit=128, threads=2048, blocks=32),
}
SM = SMS["sm_90"]
# An H100 SXM's practical rates, for the floors: about 3.0 TB/s for a large device copy (peak 3.35) and
# about 790 TFLOP/s for large BF16 cuBLAS matmuls (dense peak 989). A floor is only as good as these.
HBM_BYTES_PER_S = 3.0e12
CUBLAS_FLOPS_PER_S = 790e12


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit("kernel_report: this failed:\n  " + " ".join(cmd) + "\n" + p.stdout[-3000:])
    return p.stdout


def demangle(names):
    """Itanium C++ names of free functions, '_Z<length><name>...' -> 'name' (the kernels are neither in a
    namespace nor members, so the first name is theirs)."""
    short = []
    for n in names:
        m = re.match(r"_Z(\d+)", n)
        short.append(n[m.end(): m.end() + int(m.group(1))] if m else n)
    return short


def parse_ptxas(text):
    """{mangled name: {stack, spill_st, spill_ld, regs, barriers, smem}} from nvcc --resource-usage."""
    info, cur = {}, None
    for line in text.split("\n"):
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            cur = info.setdefault(m.group(1), {"smem": 0})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            cur["stack"], cur["spill_st"], cur["spill_ld"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers(?:, used (\d+) barriers)?", line)
        if m and cur is not None:
            cur["regs"] = int(m.group(1))
            cur["barriers"] = int(m.group(2) or 0)
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return info


def split_ptx(ptx):
    """{mangled name: (its .maxntid or None, its body lines)} of every .entry."""
    entries = {}
    parts = re.split(r"^\.visible \.entry (\S+)\(", ptx, flags=re.M)
    for name, body in zip(parts[1::2], parts[2::2]):
        m = re.search(r"^\.maxntid (\d+), (\d+), (\d+)", body, flags=re.M)
        entries[name] = (int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else None, body.split("\n"))
    return entries


# (first match wins: "float" and "int" sort the remaining arithmetic by its operand type)
CATEGORIES = [("mma", r"^mma\."), ("ldmatrix", r"^ldmatrix\."), ("cp.async", r"^cp\.async"), ("ex2", r"^ex2\."),
              ("ld/st", r"^(ld|st)\."), ("cvt/mov", r"^(cvt|cvta|mov)\b"),
              ("control", r"^(setp|selp|bra|bar|shfl|vote|membar|fence|ret|exit)\b"),
              ("float", r"^[a-z0-9]+(\.[a-z0-9]+)*\.(f16|bf16|f32|f64|f16x2|bf16x2)\b"), ("int", r".")]


def instructions(lines):
    """The instruction lines of PTX (no labels, directives, braces or comments), opcodes first."""
    out = []
    for line in lines:
        s = line.strip()
        m = re.match(r"^\{\s*(.+?;)\s*\}$", s)  # an inline-asm block on one line: { cvt.rn.bf16x2.f32 ...; }
        if m:
            s = m.group(1)
        if not s or s.startswith(("//", ".", "{", "}", "$")) or s.endswith(":"):
            continue
        s = re.sub(r"^@!?%\w+\s+", "", s)  # a predicate guard
        out.append(s)
    return out


def inner_loop(lines, key):
    """The instruction mix of the smallest loop (a label and a later branch back to it) that holds the
    most instructions of category `key`; None if no loop has one."""
    labels = {}
    best = None
    for i, line in enumerate(lines):
        m = re.match(r"^(\$L__\w+):", line.strip())
        if m:
            labels[m.group(1)] = i
            continue
        m = re.search(r"\bbra(?:\.uni)?\s+(\$L__\w+);", line)
        if m and m.group(1) in labels:  # a branch back: the loop runs from the label to here
            body = instructions(lines[labels[m.group(1)]: i + 1])
            mix = mix_of(body)
            rank = (mix[key], -len(body))
            if mix[key] > 0 and (best is None or rank > best[0]):
                best = (rank, mix)
    return best[1] if best else None


def mix_of(body):
    mix = {c: 0 for c, _ in CATEGORIES}
    for ins in body:
        for c, pattern in CATEGORIES:
            if re.match(pattern, ins):
                mix[c] += 1
                break
    mix["total"] = len(body)
    return mix


def header_constants():
    """Integer constants of llmc/*.h (#define NAME expr, static const int NAME = expr;), evaluated, for the
    dynamic shared memory the launchers ask for."""
    raw = {}
    for f in sorted(os.listdir(os.path.join(ROOT, "llmc"))):
        if not f.endswith(".h"):
            continue
        text = open(os.path.join(ROOT, "llmc", f)).read()
        for m in re.finditer(r"^#define (\w+) ([^/\n]+)", text, flags=re.M):
            raw[m.group(1)] = m.group(2).strip()
        for m in re.finditer(r"^static const int (\w+) = ([^;]+);", text, flags=re.M):
            raw[m.group(1)] = m.group(2).strip()
    values = {}

    def value(name, depth=0):
        if name in values or depth > 20:
            return values.get(name)
        expr = re.sub(r"\(int\)|\(size_t\)", "", raw[name]).replace("sizeof(float)", "4")
        for ref in set(re.findall(r"[A-Za-z_]\w*", expr)):
            if ref in raw and value(ref, depth + 1) is not None:
                expr = re.sub(r"\b%s\b" % ref, str(values[ref]), expr)
        try:
            values[name] = int(eval(expr, {"__builtins__": {}}))  # only integers and + - * / ( ) remain
        except Exception:
            values[name] = None
        return values[name]

    for name in raw:
        value(name)
    return values


# --------------------------------------------------------------------------------------------------------
# the floors at GPT-2 124M

# the rows of floors() each path runs: the fast path (--fused-kernels 1 --attention flash) and the classic
# one ("fallbk" rows run on neither without --recompute; "(...)" rows are bytes inside a product)
PATH_ROWS = {"fast": ("both", "fused", "flash"), "classic": ("both", "classic")}

# the shapes of the floors: GPT-2 124M (maxT 1024, vocabulary padded to a multiple of 128) at B=16, T=1024
GPT2_124M = dict(B=16, T=1024, C=768, L=12, NH=12, V=50257, maxT=1024)


def floors(X, consts, shape=GPT2_124M):
    """[(kernel, path, calls per step, bytes per step, FLOPs per step, note)] at `shape`, X bytes per
    element of floatX; the matmuls' FLOPs per step, the classic attention's and the parameter count. The
    calls and the cuBLAS(Lt) FLOPs are held to an emulated step of the trainer by
    tests/kernel_report_emulated.sh."""
    B, T, C, L, NH, V, maxT = (shape[k] for k in ("B", "T", "C", "L", "NH", "V", "maxT"))
    Vp = (V + 127) // 128 * 128
    hs, BT = C // NH, B * T
    BTC = BT * C
    P = (Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C)  # parameters: 124,475,904 at GPT2_124M
    stats = 2 * BT * 4                                  # a LayerNorm's mean and rstd, fp32
    causal = T * (T + 1) // 2                           # (query, key) pairs a causal head computes
    mm = 2 * B * NH * hs * causal                       # one causal attention matmul, multiply-adds x 2
    # the norm's block partials: a block per 256 elements of each tensor, at most 1024 (llmc/global_norm.h)
    sizes = [Vp * C, maxT * C] + L * [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C] + [C, C]
    norm_partials = sum(min(1024, -(-n // 256)) for n in sizes)
    rows = [
        ("encoder_forward_kernel", "both", 1, 2 * BTC * X + T * C * X + 4 * BT, 0, "wte rows + wpe in, (B,T,C) out"),
        ("residual_layernorm_forward_kernel", "fused", 2 * L + 1, (2 * L + 1) * (4 * BTC * X + stats), 0,
         "a + b -> residual and its LayerNorm (the first: no add)"),
        ("layernorm_forward_kernel", "classic", 2 * L + 1, (2 * L + 1) * (2 * BTC * X + stats), 0, ""),
        ("residual_forward_kernel", "classic", 2 * L, 2 * L * 3 * BTC * X, 0, ""),
        ("(the residual as fcproj's C)", "fused", L, L * BTC * X, 0, "the MLP's residual add inside its product (beta = 1)"),
        ("gelu_forward_vec_kernel", "fallbk", L, L * 2 * 4 * BTC * X, 0, "(B,T,4C) in and out"),
        ("(epilogue GELU_AUX_BIAS)", "fused", L, L * 4 * BTC * X, 0, "in fc's product: its GELU input, written too"),
        ("gelu_forward_kernel", "classic", L, L * 2 * 4 * BTC * X, 0, ""),
        ("flash_tc_forward_kernel", "flash", L, L * (4 * BTC * X + 4 * B * NH * T), L * 2 * mm, "QK^T and PV, causal"),
        ("heads_split_kernel", "classic", 7 * L, 7 * L * 2 * BTC * X, 0, "3 forward, 4 backward"),
        ("causal_softmax_kernel", "classic", L, L * 2 * B * NH * causal * X, 0, "(B,NH,T,T), lower half"),
        ("heads_merge_kernel", "classic", 4 * L, 4 * L * 2 * BTC * X, 0, "1 forward, 3 backward"),
        ("classifier_vec_kernel", "fused", 1, 2 * BT * Vp * X + 8 * BT, 0, "logits in, dlogits out"),
        ("classifier_kernel", "classic", 1, 2 * BT * Vp * X + 8 * BT, 0, ""),
        ("loss_mean_kernel", "fused", 1, 4 * BT, 0, ""),
        ("layernorm_backward_fused_kernel", "fused", 2 * L + 1, (2 * L + 1) * (4 * BTC * X + stats), 0,
         "dout, inp, dinp (+=) in, dinp out"),
        ("layernorm_backward_finish_kernel", "classic", 2 * L + 1, 0, 0, "(C-sized partial sums: negligible)"),
        ("layernorm_backward_finish_warps_kernel", "fused", 2 * L + 1, 0, 0, "the same, 8 warps per 32 columns"),
        ("layernorm_backward_dinp_kernel", "classic", 2 * L + 1, (2 * L + 1) * (4 * BTC * X + stats), 0, ""),
        ("layernorm_backward_partial_kernel", "classic", 2 * L + 1, (2 * L + 1) * (2 * BTC * X + stats), 0, ""),
        ("gelu_bias_backward_partial_kernel", "fused", L, L * 3 * 4 * BTC * X, 0,
         "GELU's backward and fc's bias-gradient partial sums, one pass (not cuBLASLt's DGELU_BGRAD: slower)"),
        ("gelu_backward_vec_kernel", "fallbk", L, L * 3 * 4 * BTC * X, 0, "(B,T,4C): dout and inp in, dinp out"),
        ("gelu_backward_kernel", "classic", L, L * 3 * 4 * BTC * X, 0, ""),
        ("flash_tc_backward_dot_kernel", "flash", L, L * (2 * BTC * X + 4 * B * NH * T), 0, "D = rowsum(dO * O)"),
        ("flash_tc_backward_dkdv_kernel", "flash", L, L * (6 * BTC * X + 8 * B * NH * T), L * 4 * mm,
         "QK^T, dO V^T, P^T dO, dS^T Q"),
        ("flash_tc_backward_dq_kernel", "flash", L, L * (5 * BTC * X + 8 * B * NH * T), L * 3 * mm, "QK^T, dO V^T, dS K"),
        ("causal_softmax_backward_kernel", "classic", L, L * 3 * B * NH * causal * X, 0, ""),
        ("bias_backward_partial_vec_kernel", "fallbk", L, L * 4 * C * BT * X, 0, "dout of fc (the others' in BGRADB)"),
        ("bias_backward_partial_kernel", "classic", 4 * L, L * 9 * C * BT * X, 0, ""),
        ("bias_backward_finish_kernel", "classic", 4 * L, 0, 0, "(C-sized partial sums: negligible)"),
        ("bias_backward_finish_kernel", "fused", L, 0, 0, "fc's"),
        ("(epilogue BGRADB)", "fused", 3 * L, 0, 0, "qkv, attproj, fcproj: dout's column sums as dweight reads it"),
        ("residual_forward_kernel", "fused", 3 * L, 0, 0, "an epilogue's bias gradient added to dbias (C-sized: negligible)"),
        ("encoder_backward_wte_kernel", "classic", 1, BTC * X, 0, "dout in (+ the touched rows of dwte)"),
        ("encoder_backward_wte_chunk_kernel", "fused", 1, BTC * X, 0, "the same, in chunks of <= 64 positions, a block each"),
        ("encoder_backward_wte_combine_kernel", "fused", 1, 0, 0, "the sums of a frequent token's chunks (rows of C floats: negligible)"),
        ("encoder_backward_wpe_kernel", "both", 1, BTC * X + 2 * T * C * X, 0, ""),
        ("sum_squares_batch_kernel", "fused", -(-(2 + 12 * L + 2) // consts["NORM_BATCH"]), P * X, 0,
         f"every gradient once ({2 + 12 * L + 2} tensors, {consts['NORM_BATCH']} per launch)"),
        ("sum_squares_kernel", "classic", 2 + 12 * L + 2, P * X, 0, "the same, a launch per tensor"),
        ("norm_group_sums_kernel", "fused", 1, 4 * norm_partials, 0, "the block partials, summed per tensor and group on the device"),
        ("step_loss_kernel", "fused", 1, 0, 0, "the step's mean loss (one thread; llmc/step_outputs.h)"),
        ("step_verdict_kernel", "fused", 1, 0, 0, "norm, clip factor, skip: the scalars AdamW reads (one thread)"),
        ("adamw_batch_kernel", "fused", -(-(2 + 12 * L + 2) // consts["ADAMW_BATCH"]), P * (24 + 2 * X), 0,
         f"master, m, v in and out; grad in, param out ({consts['ADAMW_BATCH']} tensors per launch)"),
        ("adamw_kernel", "classic", 2 + 12 * L + 2, P * (24 + 2 * X), 0, "the same, a launch per tensor"),
    ]
    # cuBLAS(Lt): forward qkv, attproj, fc, fcproj and the classifier; backward twice that (dinp and dweight)
    mm_fwd = 2 * BT * 12 * C * C * L + 2 * BT * C * Vp
    attention_classic = L * 3 * 2 * 2 * B * NH * T * T * hs  # per layer: QK^T and PV on the full (T,T), backward twice
    return rows, 3 * mm_fwd, attention_classic, P


def occupancy(threads, regs, smem):
    """(blocks per SM, what limits them) on the GPU of SM."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(regs * 32 / SM["reg_unit"]) * SM["reg_unit"]
    by_regs = (SM["regs"] // 4 // regs_per_warp) * 4 // warps if regs else SM["blocks"]  # warps fit per sub-partition
    per_block_smem = math.ceil((smem + SM["smem_reserved"]) / SM["smem_unit"]) * SM["smem_unit"]
    by_smem = SM["smem"] // per_block_smem
    by_threads = SM["threads"] // (warps * 32)
    limits = {"threads": by_threads, "registers": by_regs, "shared memory": by_smem, "32 blocks": SM["blocks"]}
    blocks = min(limits.values())
    return blocks, " and ".join(k for k, v in limits.items() if v == blocks)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvcc", default=os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--keep", help="write the PTX and the ptxas output into this folder")
    args = ap.parse_args()
    if not os.path.exists(args.nvcc) and not shutil.which(args.nvcc):
        sys.exit(f"kernel_report: nvcc not found ({args.nvcc}); install the CUDA toolkit or pass --nvcc")
    if args.arch not in SMS:
        sys.exit(f"kernel_report: --arch {args.arch}: the report knows {' and '.join(SMS)} (the architectures the trainer builds for)")
    global SM
    SM = SMS[args.arch]
    cc = args.arch.replace("sm_", "")
    define = {"bf16": ["-DENABLE_BF16"], "fp16": ["-DENABLE_FP16"], "fp32": []}[args.precision]
    X = 4 if args.precision == "fp32" else 2
    # the trainer's flags less NCCL and MPI, which no kernel depends on
    base = [args.nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{cc},code=sm_{cc}", "-diag-suppress", "177",
            "-DNO_NCCL"] + define + ["-I", ROOT, os.path.join(ROOT, "train_gpt.cu")]
    tmp = args.keep or tempfile.mkdtemp()
    os.makedirs(tmp, exist_ok=True)
    usage = run(base + ["--resource-usage", "-c", "-o", os.path.join(tmp, "train_gpt.o")])
    ptx_path = os.path.join(tmp, "train_gpt.ptx")
    run(base + ["-ptx", "-o", ptx_path])
    ptx = open(ptx_path).read()
    if args.keep:
        open(os.path.join(tmp, "ptxas.txt"), "w").write(usage)
    else:
        shutil.rmtree(tmp)
    info, entries = parse_ptxas(usage), split_ptx(ptx)
    # a report that parsed nothing must not look like a clean one (another nvcc may print otherwise)
    if len(entries) < 20 or set(entries) != set(info) or any("regs" not in v or "spill_st" not in v for v in info.values()):
        sys.exit(f"kernel_report: could not read the compiler's output ({len(entries)} PTX entries, {len(info)} in ptxas's "
                 f"report); --keep DIR keeps both for a look")
    mangled = sorted(set(info) | set(entries))
    short = dict(zip(mangled, demangle(mangled)))
    consts = header_constants()
    expected = {"encoder_forward_kernel"} | ({"flash_tc_forward_kernel"} if X == 2 else set())  # (flash: 16-bit builds only)
    if not expected <= set(short.values()):
        sys.exit(f"kernel_report: {', '.join(sorted(expected - set(short.values())))} not among the kernels read: has the code or "
                 "the compiler's output changed?")
    dynamic = {  # the dynamic shared memory each launcher asks for, at C = 768 (llmc/attention_flash.h, layernorm.h)
        "flash_tc_backward_dkdv_kernel": consts.get("FLASH_TC_BWD_SMEM"),
        "flash_tc_backward_dq_kernel": consts.get("FLASH_TC_BWD_SMEM"),
        "layernorm_backward_fused_kernel": (consts.get("LNB_WARPS") or 0) * 2 * 768 * 4,
        "norm_group_sums_kernel": 8 * 148,  # a double per tensor (llmc/global_norm.h), 148 at GPT-2 124M
    }

    print(f"kernel report: train_gpt.cu for {args.arch}, {args.precision.upper()} ({os.path.basename(args.nvcc)} "
          f"{run([args.nvcc, '--version']).strip().split(chr(10))[-1]})")
    print(f"\n1. resources and occupancy on an {SM['gpu']} ({SM['regs']:,} registers, {SM['smem'] // 1024} KiB shared memory, "
          f"{SM['threads']:,} threads, {SM['blocks']} blocks per SM)")
    hdr = f"  {'kernel':36s} {'threads':>7s} {'regs':>5s} {'spill B':>7s} {'smem':>6s} {'dyn smem':>9s} {'blocks/SM':>9s} {'warps/SM':>8s} {'occup.':>6s}  limited by"
    print(hdr)
    spills, unbounded, flash_regs = [], [], []
    for m in sorted(mangled, key=lambda n: short[n]):
        k, p = short[m], info.get(m, {})
        threads = entries.get(m, (None, []))[0]
        regs, smem = p.get("regs", 0), p.get("smem", 0)
        dyn = dynamic.get(k) or 0
        spill = f"{p.get('spill_st', 0)}+{p.get('spill_ld', 0)}" if p.get("spill_st", 0) + p.get("spill_ld", 0) else "0"
        if spill != "0":
            spills.append(f"{k} ({p['spill_st']} B stored, {p['spill_ld']} B loaded)")
        if k.startswith("flash_tc_") and k != "flash_tc_backward_dot_kernel":
            flash_regs.append((k, regs))
        if threads is None:
            unbounded.append(k)
            print(f"  {k:36s} {'?':>7s} {regs:5d} {spill:>7s} {smem:6d} {dyn:9d}   (no __launch_bounds__: block size unknown)")
            continue
        blocks, limit = occupancy(threads, regs, smem + dyn)
        warps = blocks * math.ceil(threads / 32)
        print(f"  {k:36s} {threads:7d} {regs:5d} {spill:>7s} {smem:6d} {dyn:9d} {blocks:9d} {warps:8d} {100 * warps / 64:5.0f}%  {limit}")

    print("\n2. the inner loop's instructions (PTX, before ptxas schedules them; SASS differs, the ratios guide)")
    print(f"  {'kernel':32s} " + " ".join(f"{c:>8s}" for c, _ in CATEGORIES) + f" {'total':>6s}  instructions per")
    for m in sorted(mangled, key=lambda n: short[n]):
        k = short[m]
        key = "mma" if k.startswith("flash_tc_") and k != "flash_tc_backward_dot_kernel" else "ex2" if k.startswith("classifier") else None
        if key is None or m not in entries:
            continue
        mix = inner_loop(entries[m][1], key)
        if mix is None:
            sys.exit(f"kernel_report: no loop of {k} holds an {key} instruction: has the kernel or the PTX changed?")
        print(f"  {k:32s} " + " ".join(f"{mix[c]:8d}" for c, _ in CATEGORIES) + f" {mix['total']:6d}  {mix['total'] / mix[key]:5.1f} {key}")

    if X != 2:
        print("\n3. floors: for the BF16 and FP16 builds only (their rates are 16-bit tensor-core rates)")
        print_targets(spills, flash_regs, unbounded)
        return
    rows, mm_flops, attention_classic, P = floors(X, consts)
    print(f"\n3. floors of one training step at GPT-2 124M (B=16, T=1024, {P:,} parameters, {X}-byte activations):"
          f" bytes at {HBM_BYTES_PER_S / 1e12:.1f} TB/s, FLOPs at {CUBLAS_FLOPS_PER_S / 1e12:.0f} TFLOP/s, the larger")
    print(f"  {'kernel':36s} {'path':>7s} {'calls':>5s} {'MB/step':>9s} {'GFLOP/step':>10s} {'floor us':>9s}  note")
    known = set(short.values())
    total = {"fast": 0.0, "classic": 0.0}
    for k, path, calls, nbytes, flops, note in rows:
        us = 1e6 * max(nbytes / HBM_BYTES_PER_S, flops / CUBLAS_FLOPS_PER_S)
        mark = "" if k in known or k.startswith("(") else "  (not in this build)"
        print(f"  {k:36s} {path:>7s} {calls:5d} {nbytes / 1e6:9.1f} {flops / 1e9:10.1f} {us:9.1f}  {note}{mark}")
        if mark:
            continue
        for p in total:
            if path in PATH_ROWS[p]:
                total[p] += us
    mm_us = 1e6 * mm_flops / CUBLAS_FLOPS_PER_S
    att_us = 1e6 * attention_classic / CUBLAS_FLOPS_PER_S
    print(f"  {'matmuls (cuBLASLt)':36s} {'both':>7s} {'':5s} {'':9s} {mm_flops / 1e9:10.1f} {mm_us:9.1f}  forward and both backward products")
    print(f"  {'attention matmuls (cuBLAS)':36s} {'classic':>7s} {'':5s} {'':9s} {attention_classic / 1e9:10.1f} {att_us:9.1f}  full (T,T): no causal saving")
    fast = (total["fast"] + mm_us) / 1000
    classic = (total["classic"] + mm_us + att_us) / 1000
    print(f"  a step's floor: {fast:.1f} ms on the fast path (--fused-kernels 1 --attention flash), {classic:.1f} ms on the"
          f" classic one; of it the kernels above: {total['fast'] / 1000:.1f} and {total['classic'] / 1000:.1f} ms")

    print_targets(spills, flash_regs, unbounded)


def print_targets(spills, flash_regs, unbounded):
    print("\ntargets (dev/cuda/README.md): no spills; every flash kernel at <= 168 registers (3 blocks of 128 threads per SM)")
    print("  spills: " + ("; ".join(spills) if spills else "none"))
    over = [f"{k} {r}" for k, r in flash_regs if r > 168]
    print("  flash kernels above 168 registers: " + (", ".join(over) if over else "none"))
    if unbounded:
        print("  kernels without __launch_bounds__ (threads per block unknown to the compiler): " + ", ".join(unbounded))


if __name__ == "__main__":
    main()
