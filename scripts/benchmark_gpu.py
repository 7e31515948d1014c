#!/usr/bin/python3
"""benchmark_gpu.py: training throughput of GPT-2 124M on one GPU, this trainer against PyTorch.

Runs, one after the other on the same GPU and with the same shapes (L=12, C=768, NH=12, V=50257 padded
to 50304, T=1024, the same micro-batch B):
  1. this trainer, build/gpu-bf16/train_gpt, from scratch on the given token data
  2. a PyTorch GPT-2 of the same shape: bf16 autocast, flash attention through
     F.scaled_dot_product_attention, torch.compile, fused AdamW
  3. llm.c's train_gpt2cu, if --llmc PATH names a local build (its own data and flags: see --llmc-args)
and prints tokens/s, MFU and the ratios to PyTorch. MFU counts 6N + 6LCT flops per token (N
parameters, L layers, C channels, T sequence length) against --peak-tflops (989, the dense BF16 peak of
an H100 SXM). The first --warmup steps of each run are not timed.

usage: scripts/benchmark_gpu.py [--batch 16] [--steps 30] [--warmup 10] [--data data/devil_train.bin]
                                [--llmc path/to/train_gpt2cu] [--llmc-args "..."] [--peak-tflops 989]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

L, C, NH, V, VP, T = 12, 768, 12, 50257, 50304, 1024


def flops_per_token(n_params):
    return 6 * n_params + 6 * L * C * T


def n_params():
    per_layer = 12 * C * C + 13 * C
    return VP * C + T * C + L * per_layer + 2 * C


def run_ours(args):
    binary = "build/gpu-bf16/train_gpt"
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: run `make gpu` first")
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.jsonl")
        cmd = [binary, "--layers", str(L), "--channels", str(C), "--heads", str(NH), "--vocab", str(V),
               "--max-seq-len", str(T), "--seq-len", str(T), "--batch-size", str(args.batch),
               "--steps", str(args.steps), "--train-data", args.data, "--val-every", "0", "--sample-every", "0",
               "--warmup", "10", "--lr", "6e-4", "--log", log]
        print("running:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in open(log)]
        rates = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][args.warmup:]
    return sum(rates) / len(rates)


def run_pytorch(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

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
            return F.cross_entropy(logits[..., :V].float().view(-1, V), targets.view(-1))

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = torch.compile(model)
    idx = torch.randint(0, V, (args.batch, T + 1), device="cuda")
    rates = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            rates.append(args.batch * T / (time.time() - t0))
    return sum(rates) / len(rates)


def run_llmc(args):
    cmd = [args.llmc] + args.llmc_args.split()
    print("running:", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rates = [float(m) for m in re.findall(r"\|\s*([0-9.]+)\s*tok/s", out)][args.warmup:]
    if not rates:
        sys.exit("no 'tok/s' figures found in llm.c's output")
    return sum(rates) / len(rates)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--data", default="data/devil_train.bin")
    p.add_argument("--llmc", default=None, help="path of a local llm.c train_gpt2cu build")
    p.add_argument("--llmc-args", default="-b 16 -t 1024 -x 30 -v 0 -s 0 -e d12",
                   help="flags for train_gpt2cu (the default trains d12 = 124M from scratch)")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    args = p.parse_args()
    if args.steps <= args.warmup:
        sys.exit("--steps must exceed --warmup")
    results = {"this trainer": run_ours(args), "PyTorch (torch.compile)": run_pytorch(args)}
    if args.llmc:
        results["llm.c"] = run_llmc(args)
    fpt = flops_per_token(n_params())
    base = results["PyTorch (torch.compile)"]
    print(f"\nGPT-2 124M, B={args.batch}, T={T}, bf16; MFU = tokens/s x {fpt / 1e9:.3f} GFLOP / {args.peak_tflops:.0f} TFLOP/s")
    print(f"{'':26s} {'tokens/s':>12s} {'MFU':>7s} {'vs PyTorch':>11s}")
    for name, rate in results.items():
        mfu = rate * fpt / (args.peak_tflops * 1e12)
        print(f"{name:26s} {rate:12.0f} {100 * mfu:6.1f}% {rate / base:10.2f}x")


if __name__ == "__main__":
    main()
