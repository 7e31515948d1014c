#!/usr/bin/python3
"""
gpt2_reference.py -- the PyTorch reference that test_gpt checks our trainer against.

What it is
----------
A from-scratch GPT-2 written with plain tensor operations (no nn.Module layers, no fused attention), so
that every line maps onto a layer in llmc/:

    x      = wte[inputs] + wpe[0:T]                                   encoder      (B, T, C)
    for each of the L blocks:
        x  = x + attproj(attention(ln1(x)))                           layernorm, matmul, attention
        x  = x + fcproj(gelu_tanh(fc(ln2(x))))                        layernorm, matmul, gelu
    logits = lnf(x) @ wte^T                                           classifier   (B, T, Vp)
    loss   = mean cross-entropy over the B*T positions, using only the first V logit columns
             (the Vp - V padded columns are excluded from the softmax)

For a few small configurations it writes two files:

    DIR/ref_<name>_model.bin   the initial parameters as an llm.c checkpoint (version 3, float32)
    DIR/ref_<name>_debug.bin   a debug state: inputs, targets, logits, loss, every gradient, the gradient
                               norm, the losses of nsteps AdamW steps on that batch, and the parameters
                               after those steps (format described in write_debug_state below)

Why float64
-----------
The parameters are drawn in float32 (that is the checkpoint our C++ code loads), then promoted to float64
for every computation. The reference is then exact to ~1e-15, so any difference the test sees is our
float32 (or bf16/fp16) arithmetic and not the reference's rounding; tolerances in test_gpt can be set from
the precision being tested alone. Results are stored as float32 since that is what the C++ side compares.

Why random biases and LayerNorm parameters
------------------------------------------
GPT-2 initializes biases to 0 and LayerNorm weights to 1, which would leave bugs in those paths (a bias
added twice, a gamma forgotten) invisible. Here they are drawn around their usual values instead.

Usage (Debian's python3-torch, runs on the CPU in a few seconds):

    /usr/bin/python3 scripts/gpt2_reference.py                       # all configs into build/ref
    /usr/bin/python3 scripts/gpt2_reference.py --config odd --check  # one config, plus self-checks
    /usr/bin/python3 scripts/gpt2_reference.py --custom 2,64,4,512,64,4,64 --name mine
"""

import argparse
import math
import os
import struct

import numpy as np
import torch

# ----------------------------------------------------------------------------------------------------
# configurations

MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
DEBUG_MAGIC, DEBUG_VERSION = 20261122, 1

HPARAMS = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0)
NSTEPS = 10

# Clipping at grad_clip = 1: "odd" starts above it (8 of its 10 steps are clipped), "small" starts below it
# (1 of 10 clipped), so both branches of clip_grad_norm_ are covered. A config may set its own "grad_clip".
CONFIGS = {
    #           V    maxT  L  NH  C   B  T   seed
    "small": dict(V=512, maxT=64, L=2, NH=4, C=64, B=4, T=64, seed=1337),
    # T < maxT and not a power of two, V not a multiple of 128, NH not a power of two
    "odd": dict(V=1000, maxT=40, L=3, NH=3, C=48, B=3, T=37, seed=4242),
    # head size 64, the one the tensor-core flash attention takes (test_gpt --attention flash); T spans
    # one full 64-row tile and a partial one
    "hs64": dict(V=512, maxT=128, L=2, NH=2, C=128, B=2, T=100, seed=6464),
}


def padded_vocab(V):
    """Vp: V rounded up to a multiple of 128 (llm.c pads the vocabulary for efficient matmuls)."""
    return (V + 127) // 128 * 128


def param_shapes(V, Vp, maxT, L, NH, C):
    """The parameter tensors in checkpoint order, with their shapes."""
    return [
        ("wte", (Vp, C)),
        ("wpe", (maxT, C)),
        ("ln1w", (L, C)),
        ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)),
        ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)),
        ("attprojb", (L, C)),
        ("ln2w", (L, C)),
        ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)),
        ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)),
        ("fcprojb", (L, C)),
        ("lnfw", (C,)),
        ("lnfb", (C,)),
    ]


# the 2-D weight matrices (per layer) get weight decay; biases and LayerNorm parameters do not
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}

# ----------------------------------------------------------------------------------------------------
# initialization (float32, deterministic)


def init_params(cfg, gen):
    """Returns a dict name -> float32 tensor. This is exactly what goes into the checkpoint."""
    V, Vp, L, C = cfg["V"], cfg["Vp"], cfg["L"], cfg["C"]
    std = 0.02
    std_resid = 0.02 / math.sqrt(2 * L)  # residual projections, scaled as in GPT-2
    params = {}
    for name, shape in param_shapes(V, Vp, cfg["maxT"], L, cfg["NH"], C):
        if name == "wte":
            t = torch.zeros(shape, dtype=torch.float32)
            t[:V] = torch.randn((V, C), generator=gen, dtype=torch.float32) * std  # rows V..Vp-1 stay 0
        elif name in ("attprojw", "fcprojw"):
            t = torch.randn(shape, generator=gen, dtype=torch.float32) * std_resid
        elif name in ("ln1w", "ln2w", "lnfw"):
            t = 1.0 + torch.randn(shape, generator=gen, dtype=torch.float32) * 0.1
        elif name in ("ln1b", "ln2b", "lnfb"):
            t = torch.randn(shape, generator=gen, dtype=torch.float32) * 0.1
        else:  # wpe, qkvw, fcw and the biases qkvb, attprojb, fcb, fcprojb
            t = torch.randn(shape, generator=gen, dtype=torch.float32) * std
        params[name] = t
    return params


# ----------------------------------------------------------------------------------------------------
# the model, written out with plain tensor ops


def layernorm(x, w, b, eps=1e-5):
    # x (B, T, C); biased variance, as nn.LayerNorm and llm.c
    mean = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # (B, T, 1)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def attention(x, qkvw, qkvb, NH):
    # x (B, T, C) -> (B, T, C), before the output projection
    B, T, C = x.shape
    hs = C // NH
    qkv = x @ qkvw.t() + qkvb  # (B, T, 3C)
    q, k, v = qkv.split(C, dim=-1)  # each (B, T, C), in that order
    q = q.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
    k = k.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
    v = v.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)  # (B, NH, T, T)
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # key j > query i
    att = att.masked_fill(future, float("-inf"))
    att = torch.softmax(att, dim=-1)  # (B, NH, T, T)
    y = att @ v  # (B, NH, T, hs)
    return y.transpose(1, 2).contiguous().view(B, T, C)  # heads concatenated (B, T, C)


def forward(p, inputs, targets, cfg):
    """p: dict of float64 tensors. Returns (logits (B, T, V), loss scalar)."""
    B, T = inputs.shape
    L, NH, V = cfg["L"], cfg["NH"], cfg["V"]
    x = p["wte"][inputs] + p["wpe"][:T]  # (B, T, C)
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        h = attention(h, p["qkvw"][l], p["qkvb"][l], NH)
        x = x + h @ p["attprojw"][l].t() + p["attprojb"][l]  # (B, T, C)
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = gelu_tanh(h @ p["fcw"][l].t() + p["fcb"][l])  # (B, T, 4C)
        x = x + h @ p["fcprojw"][l].t() + p["fcprojb"][l]  # (B, T, C)
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = (x @ p["wte"].t())[:, :, :V]  # (B, T, Vp) -> (B, T, V): padded columns excluded
    logprobs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, T, V)
    loss = -logprobs.gather(-1, targets.unsqueeze(-1)).mean()
    return logits, loss


# ----------------------------------------------------------------------------------------------------
# file writing (little-endian)


def flat_f32(tensors):
    """Concatenate tensors (in the given order) into one little-endian float32 numpy array."""
    return np.concatenate([t.detach().reshape(-1).double().numpy() for t in tensors]).astype("<f4")


def write_checkpoint(path, params, cfg):
    header = np.zeros(256, dtype="<i4")
    header[:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg["maxT"], cfg["V"], cfg["L"], cfg["NH"], cfg["C"],
                  cfg["Vp"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(flat_f32(params).tobytes())


def write_debug_state(path, cfg, hp, num_params, inputs, targets, logits, loss, grads, grad_norm, losses,
                      params_after):
    """
    Debug state layout, all little-endian:
      int32   header[256]  [0]=20261122 [1]=1 [2]=B [3]=T [4]=V [5]=Vp [6]=L [7]=NH [8]=C [9]=maxT
                           [10]=nsteps [11]=num_params, rest 0
      float32 hparams[8]   lr, beta1, beta2, eps, weight_decay, grad_clip, 0, 0
      int32   inputs[B*T], targets[B*T]
      float32 logits[B*T*V]          at the initial parameters, first V columns only
      float32 loss                   at the initial parameters
      float32 grads[num_params]      checkpoint order and layout (wte with Vp rows)
      float32 grad_norm              global L2 norm of grads, before clipping
      float32 losses[nsteps]         loss before each AdamW step (losses[0] == loss)
      float32 params_after[num_params]
    """
    B, T = inputs.shape
    header = np.zeros(256, dtype="<i4")
    header[:12] = [DEBUG_MAGIC, DEBUG_VERSION, B, T, cfg["V"], cfg["Vp"], cfg["L"], cfg["NH"], cfg["C"],
                   cfg["maxT"], len(losses), num_params]
    hparams = np.array([hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"], hp["grad_clip"],
                        0, 0], dtype="<f4")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(hparams.tobytes())
        f.write(inputs.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(np.array([loss], dtype="<f4").tobytes())
        f.write(flat_f32(grads).tobytes())
        f.write(np.array([grad_norm], dtype="<f4").tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())
        f.write(flat_f32(params_after).tobytes())


def expected_sizes(cfg, B, T, nsteps, num_params):
    model = 256 * 4 + num_params * 4
    debug = 256 * 4 + 8 * 4 + 2 * B * T * 4 + B * T * cfg["V"] * 4 + 4 + num_params * 4 + 4 + nsteps * 4 \
        + num_params * 4
    return model, debug


# ----------------------------------------------------------------------------------------------------
# one configuration end to end


def global_grad_norm(tensors):
    return math.sqrt(sum(float((t.grad ** 2).sum()) for t in tensors))


def finite_difference_check(p64, names, inputs, targets, cfg, h=1e-5, per_tensor=1):
    """Compare autograd gradients with central differences on the largest-|grad| entries of each tensor."""
    worst = 0.0
    with torch.no_grad():
        for name in names:
            t = p64[name]
            g = t.grad.reshape(-1)
            for idx in torch.topk(g.abs(), per_tensor).indices.tolist():
                flat = t.view(-1)
                orig = float(flat[idx])
                flat[idx] = orig + h
                lp = float(forward(p64, inputs, targets, cfg)[1])
                flat[idx] = orig - h
                lm = float(forward(p64, inputs, targets, cfg)[1])
                flat[idx] = orig
                fd = (lp - lm) / (2 * h)
                ag = float(g[idx])
                rel = abs(fd - ag) / max(abs(fd), abs(ag), 1e-30)
                worst = max(worst, rel)
                print(f"  fd check {name:9s}[{idx:6d}]  autograd {ag:+.12e}  fd {fd:+.12e}  rel {rel:.2e}")
    return worst


def run_config(name, cfg, out_dir, hp, nsteps, check):
    cfg = dict(cfg)
    cfg["Vp"] = padded_vocab(cfg["V"])
    V, Vp, maxT, L, NH, C, B, T = (cfg[k] for k in ("V", "Vp", "maxT", "L", "NH", "C", "B", "T"))
    assert C % NH == 0 and T <= maxT
    hp = dict(hp)
    gen = torch.Generator().manual_seed(cfg["seed"])

    # parameters in float32: this is the checkpoint
    params32 = init_params(cfg, gen)
    names = [n for n, _ in param_shapes(V, Vp, maxT, L, NH, C)]
    num_params = sum(t.numel() for t in params32.values())

    # one batch, as llm.c's dataloader reads it: B*T+1 contiguous tokens, targets shifted by one
    tokens = torch.randint(0, V, (B * T + 1,), generator=gen, dtype=torch.int64)
    inputs = tokens[:B * T].view(B, T)
    targets = tokens[1:B * T + 1].view(B, T)

    # float64 copies of the exact float32 values
    p64 = {n: params32[n].double().requires_grad_(True) for n in names}
    plist = [p64[n] for n in names]

    logits, loss = forward(p64, inputs, targets, cfg)
    loss.backward()
    grads = [p64[n].grad.clone() for n in names]
    grad_norm = global_grad_norm(plist)
    assert not grads[0][V:].any(), "padded wte rows must get zero gradient"
    if "grad_clip" in cfg:
        hp["grad_clip"] = cfg["grad_clip"]  # a per-config override, recorded in the debug state's hparams
    # the C++ side reads the hyperparameters as float32: use exactly those values here too
    hp = {k: float(np.float32(v)) for k, v in hp.items()}

    if check:
        worst = finite_difference_check(p64, names, inputs, targets, cfg)
        print(f"  [{name}] finite-difference worst relative error {worst:.2e}")
        assert worst < 1e-6, "finite-difference check failed"

    # nsteps of AdamW on the same batch
    opt = torch.optim.AdamW(
        [{"params": [p64[n] for n in names if n in DECAYED], "weight_decay": hp["weight_decay"]},
         {"params": [p64[n] for n in names if n not in DECAYED], "weight_decay": 0.0}],
        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
    losses, norms = [], []
    for step in range(nsteps):
        opt.zero_grad(set_to_none=True)
        _, l = forward(p64, inputs, targets, cfg)
        l.backward()
        losses.append(float(l))
        norms.append(global_grad_norm(plist))
        if hp["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(plist, hp["grad_clip"])
        opt.step()
    assert losses[0] == float(loss)

    os.makedirs(out_dir, exist_ok=True)
    model_path = os.path.join(out_dir, f"ref_{name}_model.bin")
    debug_path = os.path.join(out_dir, f"ref_{name}_debug.bin")
    write_checkpoint(model_path, [params32[n] for n in names], cfg)
    write_debug_state(debug_path, cfg, hp, num_params, inputs, targets, logits, float(loss), grads, grad_norm,
                      losses, plist)

    model_size, debug_size = expected_sizes(cfg, B, T, nsteps, num_params)
    assert os.path.getsize(model_path) == model_size, (model_path, os.path.getsize(model_path), model_size)
    assert os.path.getsize(debug_path) == debug_size, (debug_path, os.path.getsize(debug_path), debug_size)
    if check:
        # read the checkpoint back and make sure it holds exactly the float32 parameters
        with open(model_path, "rb") as f:
            hdr = struct.unpack("<256i", f.read(1024))
            data = np.frombuffer(f.read(), dtype="<f4")
        assert hdr[:8] == (MODEL_MAGIC, MODEL_VERSION_FP32, maxT, V, L, NH, C, Vp)
        assert np.array_equal(data, flat_f32([params32[n] for n in names]))
        assert all(b < a for a, b in zip(losses, losses[1:])), "losses do not decrease"

    print(f"[{name}] V={V} Vp={Vp} maxT={maxT} L={L} NH={NH} C={C} B={B} T={T} params={num_params}")
    print(f"  {model_path} ({model_size} bytes), {debug_path} ({debug_size} bytes)")
    print(f"  initial loss {float(loss):.10f} (ln V = {math.log(V):.4f}), grad norm {grad_norm:.10f}, "
          f"grad_clip {hp['grad_clip']}")
    print("  losses " + " ".join(f"{x:.6f}" for x in losses))
    clipped = sum(n > hp["grad_clip"] for n in norms) if hp["grad_clip"] > 0 else 0
    print("  grad norms " + " ".join(f"{x:.4f}" for x in norms) + f"  ({clipped} of {nsteps} steps clipped)")


def main():
    ap = argparse.ArgumentParser(description="Write GPT-2 reference checkpoints and debug states (float64).")
    ap.add_argument("--out-dir", default="build/ref")
    ap.add_argument("--config", choices=sorted(CONFIGS), help="write only this configuration")
    ap.add_argument("--custom", help="L,C,NH,V,maxT,B,T: a configuration of your own (with --name)")
    ap.add_argument("--name", default="custom", help="name for --custom")
    ap.add_argument("--seed", type=int, default=1234, help="seed for --custom")
    ap.add_argument("--nsteps", type=int, default=NSTEPS)
    ap.add_argument("--check", action="store_true",
                    help="also run finite-difference, read-back and loss-decrease checks")
    args = ap.parse_args()

    torch.set_num_threads(min(8, os.cpu_count() or 1))
    if args.custom:
        L, C, NH, V, maxT, B, T = (int(x) for x in args.custom.split(","))
        todo = {args.name: dict(V=V, maxT=maxT, L=L, NH=NH, C=C, B=B, T=T, seed=args.seed)}
    elif args.config:
        todo = {args.config: CONFIGS[args.config]}
    else:
        todo = CONFIGS
    for name, cfg in todo.items():
        run_config(name, cfg, args.out_dir, HPARAMS, args.nsteps, args.check)


if __name__ == "__main__":
    main()
