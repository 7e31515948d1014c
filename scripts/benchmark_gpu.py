#!/usr/bin/python3
"""benchmark_gpu.py: training speed of GPT-2 on one GPU: this trainer, PyTorch torch.compile and llm.c, side by side.

One run, one GPU, the same shapes (this trainer and llm.c read the same token file; the PyTorch model
trains on one batch of random tokens, which takes it the same time per step). For each model size and
micro-batch (by default GPT-2 124M at B=16 and B=32, and GPT-2 350M at B=16; T=1024, BF16, from scratch)
it runs
  1. this trainer, build/gpu-bf16/train_gpt, once per variant of its GPU path (--variants): classic
     (--attention classic --fused-kernels 0, today's default), flash (--attention flash), fused (--fused-kernels 1)
     and fast (both: --attention flash --fused-kernels 1);
  2. a PyTorch GPT-2 of the same shape: bf16 autocast, F.scaled_dot_product_attention (PyTorch's flash
     attention), torch.compile, fused AdamW, gradient clipping (unless --skip-pytorch);
  3. llm.c's train_gpt2cu, if --llmc DIR names a local llm.c checkout: the script builds it there
     (`make train_gpt2cu NO_MULTI_GPU=1`, no cuDNN) unless --llmc-no-build, and trains the same size from
     scratch (-e d12 / d24 / d48) on the same token file (llm.c reads the same token format). Without cuDNN,
     llm.c's attention is its own (matmuls and a softmax kernel), not a flash attention: the table says so;
and prints the device, then ms/step, tokens/s, MFU and the ratios to llm.c and to torch.compile. The
first --warmup steps of each run are not counted. MFU counts 6N + 6LCT flops per token (N parameters,
L layers, C channels, T sequence length) against --peak-tflops (989: dense BF16 of an H100 SXM).

llm.c with CUDA 13 needs two small changes before it builds (describe them to yourself as a patch; the
script does not edit your checkout):
  - cudaMemAdvise's last argument is a cudaMemLocation struct in CUDA 13, no longer an int device: where
    llm.c advises its managed fallback allocation to prefer the host (llmc/cuda_utils.cuh, the call with
    cudaCpuDeviceId), pass a cudaMemLocation whose type is cudaMemLocationTypeHost instead;
  - the Makefile links -lnvidia-ml (NVML, for its GPU utilization readout), and CUDA 13's toolkit has no
    link stub for it: drop -lnvidia-ml from the link flags and build without NVML (or point the linker at
    the driver's libnvidia-ml.so.1).

usage: scripts/benchmark_gpu.py [--configs 124M:16,124M:32,350M:16] [--steps 30] [--warmup 10]
                                [--data data/devil_train.bin] [--llmc DIR] [--llmc-no-build]
                                [--skip-pytorch] [--variants classic,flash,fast] [--peak-tflops 989] [--dry-run]
--dry-run prints the commands and shapes it would run, without a GPU (make test runs it). Each run's ms/step
is printed as soon as it is measured, so a run stopped part-way still tells what it measured.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

V, VP, T = 50257, 50304, 1024
# name: (layers, channels, heads, llm.c's -e model descriptor)
SIZES = {"124M": (12, 768, 12, "d12"), "350M": (24, 1024, 16, "d24"), "1.5B": (48, 1600, 25, "d48")}
OURS = "build/gpu-bf16/train_gpt"
# this trainer's GPU paths, each named by the flags that select it (both flags given, so a change of the
# defaults cannot change what a name measures)
VARIANTS = {"classic": ["--attention", "classic", "--fused-kernels", "0"],
            "flash": ["--attention", "flash", "--fused-kernels", "0"],
            "fused": ["--attention", "classic", "--fused-kernels", "1"],
            "fast": ["--attention", "flash", "--fused-kernels", "1"]}


def n_params(L, C):
    return VP * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def flops_per_token(L, C):
    return 6 * n_params(L, C) + 6 * L * C * T


def parse_configs(text):
    configs = []
    for item in text.split(","):
        size, _, batch = item.partition(":")
        if size not in SIZES or not batch.isdigit() or int(batch) < 1:
            sys.exit(f"error: --configs item '{item}' must be SIZE:B with SIZE one of {', '.join(SIZES)}")
        configs.append((size, int(batch)))
    return configs


class Failed(Exception):
    """One run that did not give a time: reported, and the others still run."""


def mean_after_warmup(values, warmup, what):
    kept = values[warmup:]
    if not kept:
        raise Failed(f"{what}: no timed steps after the {warmup} warmup steps")
    return sum(kept) / len(kept)


def ours_command(args, size, B, variant, log):
    L, C, NH, _ = SIZES[size]
    return [OURS, "--layers", str(L), "--channels", str(C), "--heads", str(NH), "--vocab", str(V),
            "--max-seq-len", str(T), "--seq-len", str(T), "--batch-size", str(B), "--steps", str(args.steps),
            "--train-data", args.data, "--val-data", "", "--val-every", "0", "--sample-every", "0",
            "--warmup", "10", "--lr", "6e-4", "--log", log] + VARIANTS[variant]


def run_ours(args, size, B, variant):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        cmd = ours_command(args, size, B, variant, log)
        print("running:", " ".join(cmd), flush=True)
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            raise Failed(f"this trainer ({variant}) failed: its message is above")
        rows = [json.loads(line) for line in open(log)]
    ms = [r["ms"] for r in rows if "ms" in r]
    return mean_after_warmup(ms, args.warmup, f"this trainer ({variant})")


def llmc_binary(args):
    return os.path.join(args.llmc, "train_gpt2cu")


def llmc_command(args, size, B):
    # llm.c takes "step % val_loss_every" unguarded: -v 0 divides by zero (SIGFPE). -v steps+1 validates at
    # step 0 and at the last step only, on one batch (-m 1), both outside its timed steps; -s 0 samples never.
    return [llmc_binary(args), "-i", args.data, "-j", args.data, "-b", str(B), "-t", str(T), "-x", str(args.steps),
            "-v", str(args.steps + 1), "-m", "1", "-s", "0", "-e", SIZES[size][3], "-r", "0", "-l", "6e-4", "-u", "10"]


def build_llmc(args):
    cmd = ["make", "-C", args.llmc, "train_gpt2cu", "NO_MULTI_GPU=1", "USE_CUDNN=0"]
    print("building llm.c:", " ".join(cmd), flush=True)
    if args.dry_run:
        return
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    if not os.path.exists(llmc_binary(args)):
        raise Failed(f"{llmc_binary(args)} was not built (see the patch for CUDA 13 in this script's header)")


def run_llmc(args, size, B):
    cmd = llmc_command(args, size, B)
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print((p.stdout + p.stderr)[-2000:], flush=True)
        raise Failed(f"llm.c failed (exit {p.returncode}): the end of its output is above")
    # llm.c prints one line per step: "step N/M | loss ... | ... | 50.61 ms | ... | 324000 tok/s"
    ms = [float(m) for m in re.findall(r"\|\s*([0-9.]+)\s*ms\b", p.stdout)]
    if not ms:
        raise Failed("no 'ms' figures found in llm.c's output")
    return mean_after_warmup(ms, args.warmup, "llm.c")


def run_pytorch(args, size, B):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    L, C, NH, _ = SIZES[size]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B_, T_, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B_, T_, NH, C // NH).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attproj(y.transpose(1, 2).contiguous().view(B_, T_, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VP, C), nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # tied classifier
            # idx and targets are slices of one (B, T+1) tensor: not contiguous, so reshape, not view
            return F.cross_entropy(logits[..., :V].float().reshape(-1, V), targets.reshape(-1))

    print(f"running: PyTorch torch.compile GPT-2 {size}, B={B}", flush=True)
    torch.manual_seed(0)
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = torch.compile(model)
    idx = torch.randint(0, V, (B, T + 1), device="cuda")
    ms = []
    try:
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.time()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_fn(idx[:, :-1], idx[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            ms.append(1000.0 * (time.time() - t0))
    finally:  # (the memory goes back to the GPU before the next run, also after an error)
        del model, opt, step_fn, idx
        torch.cuda.empty_cache()
    return mean_after_warmup(ms, args.warmup, "PyTorch")


def device_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()
        return out[0] if out else "unknown GPU"
    except (OSError, subprocess.CalledProcessError):
        return "no GPU found (nvidia-smi failed)"


def print_table(args, size, B, results):
    L, C, _, _ = SIZES[size]
    fpt = flops_per_token(L, C)
    print(f"\nGPT-2 {size} (L={L} C={C}), B={B}, T={T}, bf16; MFU = tokens/s x {fpt / 1e9:.3f} GFLOP / "
          f"{args.peak_tflops:.0f} TFLOP/s")
    refs = [r for r in ("llm.c", "torch.compile") if r in results]
    print(f"{'':28s} {'ms/step':>9s} {'tokens/s':>10s} {'MFU':>7s}" + "".join(f" {'vs ' + r:>16s}" for r in refs))
    for name, ms in results.items():
        rate = B * T / (ms / 1000.0)
        line = f"{name:28s} {ms:9.1f} {rate:10.0f} {100 * rate * fpt / (args.peak_tflops * 1e12):6.1f}%"
        for r in refs:
            line += f" {results[r] / ms:15.2f}x"  # tokens/s ratio = inverse ms ratio
        print(line, flush=True)
    if "llm.c" in results:
        print("(llm.c built without cuDNN: its attention is matmuls and a softmax kernel, not a flash attention)")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="124M:16,124M:32,350M:16", help="SIZE:B list, SIZE in 124M, 350M, 1.5B (GPT-2 XL, 1,557,686,400 parameters)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--data", default="data/devil_train.bin")
    p.add_argument("--variants", default="classic,flash,fast", help=f"this trainer's GPU paths to run: {', '.join(VARIANTS)}")
    p.add_argument("--llmc", default=None, help="a local llm.c checkout (see the CUDA 13 patch above)")
    p.add_argument("--llmc-no-build", action="store_true", help="use DIR/train_gpt2cu as it is")
    p.add_argument("--skip-pytorch", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    args = p.parse_args()
    if args.steps <= args.warmup:
        sys.exit("error: --steps must exceed --warmup")
    configs = parse_configs(args.configs)
    variants = [a for a in args.variants.split(",") if a]
    if not variants or any(a not in VARIANTS for a in variants):
        sys.exit(f"error: --variants takes a comma-separated list of {', '.join(VARIANTS)}")
    if not os.path.exists(args.data):
        sys.exit(f"error: no token file at {args.data}")
    if args.llmc and not os.path.isdir(args.llmc):
        sys.exit(f"error: --llmc {args.llmc} is not a directory (give the llm.c checkout)")
    if not args.dry_run and not os.path.exists(OURS):
        sys.exit(f"error: {OURS} is missing: run `make gpu` first")
    print(f"device: {device_name()}", flush=True)
    failed = []
    if args.llmc and not args.llmc_no_build:
        try:
            build_llmc(args)
        except (Failed, subprocess.CalledProcessError) as e:
            print(f"error: llm.c did not build ({e}): the benchmark goes on without it", flush=True)
            failed.append("llm.c's build")
            args.llmc = None
    for size, B in configs:
        if args.dry_run:
            for a in variants:
                print("would run:", " ".join(ours_command(args, size, B, a, "LOG.jsonl")))
            if args.llmc:
                print("would run:", " ".join(llmc_command(args, size, B)))
            if not args.skip_pytorch:
                print(f"would run: PyTorch torch.compile GPT-2 {size} (L, C, NH = {SIZES[size][:3]}), B={B}, T={T}, "
                      f"{args.steps} steps")
            continue
        results = {}
        runs = [(f"this trainer ({a})", lambda a=a: run_ours(args, size, B, a)) for a in variants]
        if args.llmc:
            runs.append(("llm.c", lambda: run_llmc(args, size, B)))
        if not args.skip_pytorch:  # last: its compilation takes the longest
            runs.append(("torch.compile", lambda: run_pytorch(args, size, B)))
        for name, measure in runs:
            try:
                results[name] = measure()
                print(f"measured: GPT-2 {size} B={B} {name}: {results[name]:.2f} ms/step", flush=True)
            except Failed as e:
                print(f"error: {e}", flush=True)
                failed.append(f"{size} B={B} {name}")
            except Exception:  # (PyTorch's own errors: shown whole, and the other runs still go on)
                traceback.print_exc()
                failed.append(f"{size} B={B} {name}")
        print_table(args, size, B, results)
    if failed:
        sys.exit(f"error: {len(failed)} run(s) gave no time: {', '.join(failed)}")


if __name__ == "__main__":
    main()
