"""Symo's optimizer step on 1, 2 and 4 CPU processes (gloo), FSDP2 and DDP, on gpt_muon and gpt_true.

Per optimizer step, summed over the ranks: the bytes each rank sends (all-to-all: exactly its splits to
other ranks; all-gather: its input to every other rank; all-reduce: 2 (w - 1) / w of its input; reduce-
scatter: (w - 1) / w), the collectives (per rank), the matrix functions computed (the busiest rank's and
the total), and the step time (the slowest rank's median) against one process. Every collective is seen
by one TorchDispatchMode around `step()`, the distributed mode's exchanges and DTensor's own alike.

Modes: `fsdp` and `replicated` (DDP) are Symo's distributed modes; `fsdp_implicit` is Symo stepping on
the DTensors as they are (distributed_mode="off": DTensor redistributes behind its back, every rank
computes every matrix function), `replicated_every_rank` is DDP with every rank running the whole step.
For scale, each entry also has FSDP2's own traffic per training step (analytic: all-gather of the
parameters for forward and for backward, reduce-scatter of the gradients: 3 (w - 1) / w of the
parameter bytes per rank) or DDP's (all-reduce of the gradients, 2 (w - 1) / w per rank).

    python -m benchmarks.distributed            # small GPT, 2 warm-up + 5 timed steps, one thread per process
    python -m benchmarks.distributed --quick    # 1 + 2 steps
    python -m benchmarks.distributed --device cuda --backend nccl --worlds 1,2    # one GPU per process

Writes benchmarks/results/distributed.{md,json}; the JSON is
{mode: {world: {spec: {"bytes", "collectives", "matrix_functions_per_rank", "matrix_functions_total",
"step_ms", "x_one_process", ...}}}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

import symo.optim.kinds.polar as polar_kind
from symo.optim import Symo
from symo.optim.kinds.eigen_adam import EigenAdam
from symo.optim.kinds.root import Root
from symo.train.models import GPT

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = {"gpt_muon": {}, "gpt_true": {"dqk{i}": 16, "dvo{i}": 16}}
MODES = {"fsdp": ("fsdp", "fsdp"), "replicated": ("ddp", "replicated"),
         "fsdp_implicit": ("fsdp", "off"), "replicated_every_rank": ("ddp", "off")}
BATCH, BLOCK, VOCAB = 8, 32, 65
COLLECTIVES = ("all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "alltoall", "all_to_all",
               "broadcast")


def model() -> GPT:
    return GPT(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, block_size=BLOCK)


class Traffic(TorchDispatchMode):
    """Counts the collectives dispatched inside it and the bytes this rank sends in them."""

    def __init__(self, world: int) -> None:
        super().__init__()
        self.world, self.collectives, self.bytes = world, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented  # DTensor dispatches it, with this mode still seeing its collectives
        name = func._schema.name.split("::")[-1]
        if func.namespace in ("c10d", "_c10d_functional") and any(k in name for k in COLLECTIVES):
            self.collectives += 1
            self.bytes += self._sent(name, args)
        return func(*args, **kwargs)

    def _sent(self, name: str, args) -> int:
        w = self.world
        tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
        if "alltoall" in name or "all_to_all" in name:  # (output, input, ..., output splits, input splits)
            send = tensors[1] if "alltoall" in name else tensors[0]
            splits = [a for a in args if isinstance(a, (list, tuple)) and a and all(isinstance(x, int) for x in a)]
            sizes = splits[-1] if splits else [send.numel() // w] * w
            return sum(k for r, k in enumerate(sizes) if r != dist.get_rank()) * send.element_size()
        if "gather" in name:  # c10d's list forms put the input last, the functional form first
            return _bytes(tensors[-1] if name.endswith("_") else tensors[0]) * (w - 1)
        data = _bytes(tensors[0])
        if "reduce_scatter" in name:
            return data * (w - 1) // w
        if "reduce" in name:
            return 2 * data * (w - 1) // w
        return data * (w - 1)  # broadcast from this rank


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        else:
            yield a


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextlib.contextmanager
def counting_matrix_functions(calls: Counter):
    """Count the matrix functions per block (the polar kind's, the root kind's refreshes of stored statistics and
    eigen_adam's eigenbasis refreshes, SOAP's), by wrapping the places the step computes them; the tests count
    with it too."""
    single = polar_kind.current_statistic_apply
    refreshes = {kind: kind.refresh for kind in (Root, EigenAdam)}

    def single_counted(y, **k):
        calls[k["plan"].where] += 1
        return single(y, **k)

    def counted(refresh):
        def refresh_counted(self, stage, blocks, ctx):
            for b in blocks:
                calls[b.plan.where] += 1
            return refresh(self, stage, blocks, ctx)
        return refresh_counted

    polar_kind.current_statistic_apply = single_counted
    for kind, refresh in refreshes.items():
        kind.refresh = counted(refresh)
    try:
        yield
    finally:
        polar_kind.current_statistic_apply = single
        for kind, refresh in refreshes.items():
            kind.refresh = refresh


def run_one(spec: str, wrap: str, mode: str, warmup: int, steps: int, world: int, rank: int,
            device: str = "cpu") -> dict:
    torch.manual_seed(0)
    net = model().to(device)
    n_params = sum(p.numel() for p in net.parameters())
    if wrap == "fsdp":
        for block in net.transformer.h:
            fully_shard(block)
        fully_shard(net)
        inner = net
    elif wrap == "ddp":
        net = DistributedDataParallel(net, device_ids=[device] if device.startswith("cuda") else None)
        inner = net.module
    else:
        inner = net
    opt = Symo(inner.named_parameters(), spec, sizes=SPECS[spec], update_scale="muon", distributed_mode=mode)
    calls: Counter = Counter()
    stack = contextlib.ExitStack()
    stack.enter_context(counting_matrix_functions(calls))  # for the rest of this worker process
    times, traffic = [], []
    for step in range(warmup + steps):
        gen = torch.Generator().manual_seed(step)
        idx = torch.randint(0, VOCAB, (BATCH, BLOCK), generator=gen).to(device)
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        opt.zero_grad()
        net(idx[rows], idx[rows])[1].backward()
        counter = Traffic(world)
        if dist.is_initialized():
            dist.barrier()
        sync(device)
        start = time.perf_counter()
        with counter:
            opt.step()
        sync(device)
        times.append(time.perf_counter() - start)
        traffic.append((counter.collectives, counter.bytes))
        if step == warmup - 1:
            calls.clear()
    return {"step_ms": 1000 * statistics.median(times[warmup:]), "collectives": traffic[-1][0],
            "bytes": traffic[-1][1], "matrix_functions": sum(calls.values()) / steps, "params": n_params}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def worker(rank: int, world: int, port: int, folder: str, warmup: int, steps: int, device: str,
           backend: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        device = f"cuda:{rank}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        out = {f"{m}|{s}": run_one(s, w, mode, warmup, steps, world, rank, device)
               for m, (w, mode) in MODES.items() for s in SPECS}
        Path(folder, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 warm-up and 2 timed steps")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per process)")
    ap.add_argument("--backend", default="gloo", help="gloo, or nccl (with --device cuda)")
    ap.add_argument("--out", default=str(RESULTS / "distributed"))
    args = ap.parse_args()
    if args.quick:
        args.warmup, args.steps = 1, 2
    torch.set_num_threads(1)
    alone = {s: run_one(s, "none", "off", args.warmup, args.steps, 1, 0, args.device) for s in SPECS}
    result: dict = {m: {} for m in MODES}
    for world in (int(w) for w in args.worlds.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            # fork is quick on CPU; CUDA needs fresh processes
            mp.start_processes(worker, args=(world, free_port(), folder, args.warmup, args.steps, args.device,
                                             args.backend), nprocs=world,
                               start_method="spawn" if args.device.startswith("cuda") else "fork")
            ranks = [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(world)]
        for m, (wrap, _) in MODES.items():
            for s in SPECS:
                per = [r[f"{m}|{s}"] for r in ranks]
                param_bytes = 4 * per[0]["params"]
                own = (3 if wrap == "fsdp" else 2) * param_bytes * (world - 1)  # summed over ranks
                step_ms = max(p["step_ms"] for p in per)
                result[m].setdefault(str(world), {})[s] = {
                    "bytes": sum(p["bytes"] for p in per), "collectives": max(p["collectives"] for p in per),
                    "matrix_functions_per_rank": max(p["matrix_functions"] for p in per),
                    "matrix_functions_total": sum(p["matrix_functions"] for p in per),
                    "step_ms": round(step_ms, 2), "x_one_process": round(step_ms / alone[s]["step_ms"], 3),
                    f"{'fsdp2' if wrap == 'fsdp' else 'ddp'}_training_bytes": own,
                    "ratio_to_training_traffic": round(sum(p["bytes"] for p in per) / own, 4) if own else None}
    result["one_process"] = {s: {"step_ms": round(a["step_ms"], 2), "matrix_functions": a["matrix_functions"],
                                 "params": a["params"]} for s, a in alone.items()}
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(args.out + ".md").write_text(report(result, args))
    print(report(result, args))


def report(result: dict, args) -> str:
    n = next(iter(result["one_process"].values()))["params"]
    extra = "" if args.device == "cpu" else f" --device {args.device} --backend {args.backend}"
    cores = "" if args.device != "cpu" else (
        f" The machine has {os.cpu_count()} cores, shared with other jobs while this ran, so the processes share "
        "them: the step times show the overhead of the exchanges, not a speed-up.")
    lines = ["# Symo on several processes (benchmarks/distributed.py)", "",
             f"Command: `python -m benchmarks.distributed --worlds {args.worlds} --warmup {args.warmup} "
             f"--steps {args.steps}{extra}`",
             f"Machine: {platform.machine()}, torch {torch.__version__}, {args.backend} on {args.device}, one torch "
             "thread per process; "
             f"GPT with 2 layers, d_model 64, 4 heads ({n:,} parameters), float32, global batch {BATCH} x {BLOCK}, "
             "default Symo options (the Muon path) with update_scale='muon'." + cores, "",
             "bytes: sent per optimizer step, summed over the ranks; collectives: per rank and step; matrix "
             "functions: the busiest rank's / all ranks'; x one: the slowest rank's median step time over one "
             "process's; training traffic: FSDP2's own per training step (3 (w-1)/w of the parameter bytes per "
             "rank) or DDP's (2 (w-1)/w), summed over the ranks.", "",
             "| mode | world | spec | bytes | collectives | matrix fns rank / total | step ms | x one "
             "| training traffic | bytes / training |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in MODES:
        for world, specs in result[m].items():
            for s, r in specs.items():
                own = r.get("fsdp2_training_bytes", r.get("ddp_training_bytes"))
                ratio = "-" if r["ratio_to_training_traffic"] is None else f"{r['ratio_to_training_traffic']:.3f}"
                fns = f"{r['matrix_functions_per_rank']:g} / {r['matrix_functions_total']:g}"
                lines.append(f"| {m} | {world} | {s} | {r['bytes']:,} | {r['collectives']} | {fns} | "
                             f"{r['step_ms']:.1f} | {r['x_one_process']:.2f} | {own:,} | {ratio} |")
    lines.append("")
    lines.append("One process, no wrapper: " + ", ".join(
        f"{s} {a['step_ms']:.1f} ms ({a['matrix_functions']:g} matrix functions)"
        for s, a in result["one_process"].items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
