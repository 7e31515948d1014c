#!/usr/bin/python3
"""benchmark_cpu.py: this trainer's CPU target against llm.c's CPU trainer (train_gpt2.c), side by side.

Builds llm.c's train_gpt2.c from a local checkout (its own Makefile, in a temporary copy) and this
repository's CPU trainer, writes one llm.c checkpoint with our --save-model (GPT-2 initialization, the
sizes below), and trains both from it on the same token file (data/devil_train.bin, llm.c's token format)
with the same batch, the same number of OpenMP threads and no evaluation or sampling in the timed steps.
Prints ms/step of each (the mean over the steps after the first, which pays for first touches) and the
ratio; with --cpu-matmul both (the default where the build has OpenBLAS) ours runs twice, with OpenBLAS
and with the reference GEMM.

llm.c's train_gpt2.c has its sizes and loop in main() (B=4, T=64, 41 steps, validation every 10 steps,
sampling every 20, the checkpoint gpt2_124M.bin and the data under dev/data/ in the working folder): the
copy gets B, T and the step count of the configuration, validation and sampling off, nothing else changed.

Configurations (--config):
  issue    L=4 C=256 NH=4 V=50257, B=4 T=128, 12 steps   (the comparison of issue 25)
  default  L=4 C=128 NH=4 V=50257, B=8 T=64,  12 steps   (`make train`'s model and batch)

A measurement, not a test: on a shared machine other jobs move the numbers; both trainers run in one
invocation, one after the other, so that they see the same machine.

usage: scripts/benchmark_cpu.py /path/to/llm.c [--config issue|default|both] [--threads 2] [--steps 12]
                                [--cpu-matmul blas|reference|both]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "issue": dict(L=4, C=256, NH=4, V=50257, B=4, T=128),
    "default": dict(L=4, C=128, NH=4, V=50257, B=8, T=64),
}


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if p.returncode != 0:
        sys.exit("benchmark_cpu: %s failed (exit %d):\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p.stdout


def patch_llmc(src, B, T, steps):
    """train_gpt2.c with this configuration's B, T and steps, validation and sampling off"""
    edits = [
        (r"int B = \d+;", "int B = %d;" % B),
        (r"int T = \d+;", "int T = %d;" % T),
        (r"for \(int step = 0; step <= \d+; step\+\+\)", "for (int step = 0; step < %d; step++)" % steps),
        (r"if \(step % 10 == 0\)", "if (0)"),  # validation
        (r"if \(step > 0 && step % 20 == 0\)", "if (0)"),  # sampling
    ]
    for pattern, repl in edits:
        src, n = re.subn(pattern, repl, src)
        if n != 1:
            sys.exit("benchmark_cpu: train_gpt2.c: expected one '%s', found %d (another llm.c version?)" % (pattern, n))
    return src


def mean_after_first(ms):
    return sum(ms[1:]) / len(ms[1:]) if len(ms) > 1 else ms[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("llmc", help="a local checkout of karpathy/llm.c (with train_gpt2.c and its Makefile)")
    ap.add_argument("--config", choices=["issue", "default", "both"], default="both")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both trainers [2]")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--cpu-matmul", choices=["blas", "reference", "both"], default=None,
                    help="our matmuls [both where the build has OpenBLAS, else reference]")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/cpu/train_gpt"), help="our trainer [build/cpu/train_gpt, made here]")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.llmc, "train_gpt2.c")):
        sys.exit("benchmark_cpu: %s has no train_gpt2.c (give the folder of an llm.c checkout)" % args.llmc)
    if args.steps < 2:
        sys.exit("benchmark_cpu: --steps must be at least 2 (the first step is not counted)")
    if args.bin == os.path.join(ROOT, "build/cpu/train_gpt"):
        run(["make", "-s", "-C", ROOT, "build/cpu/train_gpt"])
    help_text = run([args.bin, "--help"])
    has_flag = "--cpu-matmul" in help_text
    has_blas = has_flag and subprocess.run([args.bin, "--cpu-matmul", "blas", "--plan"], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL).returncode == 0
    matmuls = {"both": ["blas", "reference"], None: ["blas", "reference"] if has_blas else ["reference"]}.get(args.cpu_matmul,
                                                                                                       [args.cpu_matmul])
    if "blas" in matmuls and not has_blas:
        sys.exit("benchmark_cpu: %s has no OpenBLAS (--cpu-matmul blas)" % args.bin)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    data = os.path.join(ROOT, "data/devil_train.bin")
    tmp = tempfile.mkdtemp(prefix="benchmark_cpu.")
    try:
        # llm.c, built once: its Makefile in a copy of the checkout's top folder and llmc/ (the sizes are patched per config)
        names = ["issue", "default"] if args.config == "both" else [args.config]
        results = []
        for name in names:
            cfg = CONFIGS[name]
            work = os.path.join(tmp, name)
            os.makedirs(os.path.join(work, "dev/data/tinyshakespeare"))
            shutil.copytree(os.path.join(args.llmc, "llmc"), os.path.join(work, "llmc"))
            shutil.copy(os.path.join(args.llmc, "Makefile"), work)
            with open(os.path.join(args.llmc, "train_gpt2.c")) as f:
                src = patch_llmc(f.read(), cfg["B"], cfg["T"], args.steps)
            with open(os.path.join(work, "train_gpt2.c"), "w") as f:
                f.write(src)
            run(["make", "-s", "-C", work, "train_gpt2"])
            for split in ("train", "val"):
                os.symlink(data, os.path.join(work, "dev/data/tinyshakespeare/tiny_shakespeare_%s.bin" % split))
            # one checkpoint, GPT-2 initialization, written by our trainer in llm.c's format (version 3, fp32)
            ckpt = os.path.join(work, "gpt2_124M.bin")
            run([args.bin, "--layers", str(cfg["L"]), "--channels", str(cfg["C"]), "--heads", str(cfg["NH"]), "--vocab", str(cfg["V"]),
                 "--max-seq-len", str(cfg["T"]), "--steps", "0", "--val-every", "0", "--sample-every", "0", "--tokenizer", "",
                 "--save-model", ckpt], env=env)
            print("config %s: L=%d C=%d NH=%d V=%d, B=%d T=%d, %d steps, %d OpenMP threads, one checkpoint (%s)" %
                  (name, cfg["L"], cfg["C"], cfg["NH"], cfg["V"], cfg["B"], cfg["T"], args.steps, args.threads, ckpt))
            out = run([os.path.join(work, "train_gpt2")], cwd=work, env=env)
            llmc_ms = [float(m) for m in re.findall(r"^step \d+: train loss [-0-9.naif]+ \(took ([0-9.]+) ms\)", out, re.M)]
            if len(llmc_ms) != args.steps:
                sys.exit("benchmark_cpu: llm.c printed %d step times, not %d:\n%s" % (len(llmc_ms), args.steps, out[-2000:]))
            row = {"config": name, "llm.c": mean_after_first(llmc_ms)}
            for mm in matmuls:
                log = os.path.join(work, "ours_%s.jsonl" % mm)
                run([args.bin, "--model", ckpt, "--train-data", data, "--val-data", "", "--tokenizer", "", "--batch-size", str(cfg["B"]),
                     "--seq-len", str(cfg["T"]), "--steps", str(args.steps), "--val-every", "0", "--sample-every", "0",
                     "--log", log] + (["--cpu-matmul", mm] if has_flag else []), env=env)
                ms = [r["ms"] for r in map(json.loads, open(log)) if "step" in r and "ms" in r and "loss" in r]
                row[mm] = mean_after_first(ms)
            results.append(row)
            print("  llm.c train_gpt2.c      %8.1f ms/step" % row["llm.c"])
            for mm in matmuls:
                print("  ours, --cpu-matmul %-9s %8.1f ms/step   %.2fx llm.c" % (mm, row[mm], row["llm.c"] / row[mm]))
        print("ratio = llm.c ms/step / ours (above 1: ours is faster); mean over steps 2..%d" % args.steps)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
