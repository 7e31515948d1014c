#!/usr/bin/python3
"""ncu_breakdown.py: where a training step's GPU time goes, kernel by kernel, against each kernel's floor.

Reads the CSV that Nsight Compute writes for a profiled training run,
    ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --log-file run.csv \\
        ./build/gpu-bf16/train_gpt <GPT-2 124M, B=16, T=1024> --steps N --val-every 0 --sample-every 0
(one row per kernel launch; columns "Kernel Name", "Metric Name", "Metric Unit", "Metric Value" and, where
present, "ID"), and prints per kernel: launches and microseconds per step (the run's totals over --steps),
its share of the kernels' time, and, for GPT-2 124M at B=16 T=1024 in BF16, its floor from the static
report (dev/cuda/kernel_report.py: the fewest bytes at 3.0 TB/s or FLOPs at 790 TFLOP/s) and the ratio
measured / floor. The trainer's kernels are named by their function; every other kernel (cuBLAS(Lt)'s
products, their split-K reductions) is summed into one line held to the matmuls' floor. The sum of all
kernels per step, set beside the step's measured time (--step-ms, from a run without the profiler), says
how much of a step is spent outside kernels (launch gaps, host waits).

--path fast (--attention flash --fused-kernels 1) or classic (--attention classic --fused-kernels 0) picks
which of the report's rows are the floors of the run. Every launch of the run is counted, the few before
the first step (initialization) too, and the total divided by --steps: profile a few steps so they weigh
little. Run ncu with --cache-control none, so that each kernel finds the caches as a training step leaves
them (ncu's default flushes them before every kernel).

usage: ncu_breakdown.py RUN.csv --steps N [--path fast|classic] [--step-ms MS]
"""
import argparse
import csv
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "dev", "cuda"))
import kernel_report  # noqa: E402  (the floors, one definition)

LIBRARY = "(cuBLAS(Lt) and other library kernels)"
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def trainer_kernels():
    """The names of the __global__ functions of llmc/ (and llmc/comm/)."""
    names = set()
    for folder in ("llmc", os.path.join("llmc", "comm")):
        for f in os.listdir(os.path.join(ROOT, folder)):
            if f.endswith(".h"):
                text = open(os.path.join(ROOT, folder, f)).read()
                names |= set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(", text))
    return names


def base_name(kernel):
    """'void flash_tc_forward_kernel<__nv_bfloat16>(const ...)' or 'flash_tc_forward_kernel' -> the function's
    name; a library kernel keeps its (possibly namespaced) name without its arguments."""
    name = re.sub(r"^void\s+", "", kernel.strip())
    return re.split(r"[(<]", name, maxsplit=1)[0].split("::")[-1] or kernel


def read_launches(path):
    """[(kernel name, microseconds)], one per launch."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line and '"Metric Value"' in line), None)
    if start is None:
        sys.exit(f"ncu_breakdown: {path} holds no ncu CSV table (a header with \"Kernel Name\" and \"Metric Value\")")
    launches, seen = [], set()
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum" or not row.get("Metric Value"):
            continue
        unit = row.get("Metric Unit", "nsecond").strip()
        if unit not in TO_US:
            sys.exit(f"ncu_breakdown: unknown time unit '{unit}' in {path}")
        key = row.get("ID") or len(launches)
        if key in seen:  # a launch is one row per metric: the one metric asked for gives one row
            continue
        seen.add(key)
        launches.append((row["Kernel Name"], float(row["Metric Value"].replace(",", "")) * TO_US[unit]))
    if not launches:
        sys.exit(f"ncu_breakdown: {path} has no gpu__time_duration.sum rows (was ncu given --metrics gpu__time_duration.sum?)")
    return launches


def floors_us(path):
    """{kernel: floor in us per step} on this path at GPT-2 124M, B=16, T=1024, BF16; and the matmuls' floor."""
    rows, mm_flops, attention_classic, _ = kernel_report.floors(2, kernel_report.header_constants())
    out = {}
    for k, p, _, nbytes, flops, _ in rows:
        if p in kernel_report.PATH_ROWS[path] and not k.startswith("("):
            us = 1e6 * max(nbytes / kernel_report.HBM_BYTES_PER_S, flops / kernel_report.CUBLAS_FLOPS_PER_S)
            out[k] = out.get(k, 0.0) + us
    library = mm_flops + (attention_classic if path == "classic" else 0)
    return out, 1e6 * library / kernel_report.CUBLAS_FLOPS_PER_S


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, required=True, help="training steps the profiled run took")
    ap.add_argument("--path", choices=["fast", "classic"], default="fast")
    ap.add_argument("--step-ms", type=float, help="the step's time measured without the profiler")
    args = ap.parse_args()
    if args.steps < 1:
        sys.exit("ncu_breakdown: --steps must be at least 1")
    ours = trainer_kernels()
    if not ours:
        sys.exit("ncu_breakdown: found no __global__ function in llmc/: run it from the trainer's checkout")
    totals = {}
    for kernel, us in read_launches(args.csv):
        name = base_name(kernel)
        name = name if name in ours else LIBRARY
        calls, t = totals.get(name, (0, 0.0))
        totals[name] = (calls + 1, t + us)
    if set(totals) == {LIBRARY}:
        sys.exit(f"ncu_breakdown: none of {args.csv}'s kernels is one of the trainer's (by name): was it a training run?")
    floors, library_floor = floors_us(args.path)
    floors[LIBRARY] = library_floor
    step_us = sum(t for _, t in totals.values()) / args.steps
    print(f"GPU time per step by kernel ({args.csv}, {args.steps} steps averaged; floors: GPT-2 124M B=16 T=1024 BF16, "
          f"the {args.path} path)")
    print(f"  {'kernel':40s} {'calls':>6s} {'us/step':>9s} {'share':>6s} {'floor us':>9s} {'x floor':>8s}")
    for name, (calls, t) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
        us = t / args.steps
        floor = floors.get(name)
        ratio = f"{us / floor:8.1f}" if floor else f"{'-':>8s}"
        print(f"  {name:40s} {calls / args.steps:6.1f} {us:9.1f} {100 * us / step_us:5.1f}% "
              f"{floor if floor else 0:9.1f} {ratio}")
    floor_sum = sum(floors.get(name, 0.0) for name in totals)
    line = f"  all kernels: {step_us / 1000:.2f} ms per step"
    if floor_sum > 0:
        line += f", {step_us / floor_sum:.2f}x their floors' {floor_sum / 1000:.2f} ms"
    if args.step_ms:
        line += (f"; the step measured {args.step_ms:.2f} ms, so {max(0.0, args.step_ms - step_us / 1000):.2f} ms "
                 "of it ran no kernel (launch gaps, host waits)")
    print(line)
    missing = sorted(k for k in floors if k not in totals and floors[k] > 0)
    if missing:
        print("  kernels with a floor on this path that did not run: " + ", ".join(missing))


if __name__ == "__main__":
    main()
