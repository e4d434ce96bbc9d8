"""Gauge twins in a transformer (the published protocol of Singh 2026, §4): train a network and its per-head query/key
rotation in lockstep, and watch whether the optimizer keeps them functionally identical.

    python -m benchmarks.gauge_twins              # 1500 steps, five arms, pool of 2
    python -m benchmarks.gauge_twins --quick      # 12 steps, to a temp dir

Modular addition mod 47 ([a, b, '='] -> (a + b) mod 47 at the last position), 40% of the 2209 pairs for
training, full batch, float32, deterministic. The twin multiplies each head's rows of W_Q and W_K by
the same Haar-orthogonal A_h (a true symmetry: q.k is unchanged), so any drift between the twins is
the optimizer's doing. Controls: the identity twin (zero drift; run for the Adam arm) and a noise twin
(N(0, 1e-7^2) added to W_Q, W_K). Arms: Adam, heavy-ball SGD, shared-scalar Adam, Muon, and Symo with
the per-head gauge spec specs/mod_add_qk_gauge.toml (ours). Each finished arm goes to a run cache,
gauge_twins_runs.json beside the outputs (benchmarks/harness.py): an invocation trains only the arms it
lacks.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import symo
from benchmarks.harness import RunCache, RunPool, write_results
from symo.experiments import zoo
from symo.train.progress import progress as tqdm

ROOT = Path(__file__).resolve().parent.parent

P, D, HEADS, DH, LAYERS = 47, 64, 4, 16, 2
METRIC_STEPS = (0, 1, 10, 50, 100, 300, 600, 1000, 1500)
ARMS = ("adam", "sgd_momentum", "scalar_adam", "muon", "symo")
TWIN_SEEDS = (777, 999, 1234)
RESULTS = ROOT / "benchmarks" / "results"


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.normalize(x, dim=-1) * math.sqrt(x.shape[-1]) * self.g


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, HEADS, DH).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(DH), dim=-1)  # no mask
        return self.o((att @ v).transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1, self.attn, self.n2 = RMSNorm(D), Attention(), RMSNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D, bias=False), nn.Linear(4 * D, D, bias=False)

    def forward(self, h):
        h = h + self.attn(self.n1(h))
        return h + self.fc2(F.silu(self.fc1(self.n2(h))))


class ModAdd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(P + 1, D)
        self.pos = nn.Parameter(torch.randn(1, 3, D) * 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, P, bias=False)

    def forward(self, x):
        h = self.emb(x) + self.pos
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.norm(h)[:, -1])


def data():
    a, b = torch.meshgrid(torch.arange(P), torch.arange(P), indexing="ij")
    x = torch.stack([a.reshape(-1), b.reshape(-1), torch.full((P * P,), P)], dim=1)
    y = (x[:, 0] + x[:, 1]) % P
    perm = torch.randperm(P * P, generator=torch.Generator().manual_seed(42))
    n_train = int(0.4 * P * P)
    return (x[perm[:n_train]], y[perm[:n_train]]), (x[perm[n_train:]], y[perm[n_train:]])


def rotate_twin(model: ModAdd, seed: int) -> ModAdd:
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in twin.blocks:
            for h in range(HEADS):
                # QR in float64 so the twin is an exact symmetry at any working precision
                a_h = torch.linalg.qr(torch.randn(DH, DH, generator=gen).double()).Q.to(blk.attn.q.weight.dtype)
                rows = slice(h * DH, (h + 1) * DH)
                blk.attn.q.weight[rows] = a_h @ blk.attn.q.weight[rows]
                blk.attn.k.weight[rows] = a_h @ blk.attn.k.weight[rows]
    return twin


def noise_twin(model: ModAdd, seed: int = 888, sigma: float = 1e-7) -> ModAdd:
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in twin.blocks:
            for w in (blk.attn.q.weight, blk.attn.k.weight):
                w.add_(torch.randn(w.shape, generator=gen) * sigma)
    return twin


def make_optimizer(arm: str, model: ModAdd) -> list[torch.optim.Optimizer]:
    named = list(model.named_parameters())
    if arm == "adam":
        return [torch.optim.Adam([p for _, p in named], lr=1e-3)]
    if arm == "sgd_momentum":
        return [torch.optim.SGD([p for _, p in named], lr=0.5, momentum=0.9)]
    if arm == "scalar_adam":
        return [zoo.ScalarAdam([p for _, p in named], lr=3e-3)]
    if arm == "muon":
        hidden = [p for n, p in named if p.ndim == 2 and n.startswith("blocks.")]
        rest = [p for n, p in named if not (p.ndim == 2 and n.startswith("blocks."))]
        return [zoo.Muon(hidden, lr=0.02, momentum=0.9), torch.optim.Adam(rest, lr=1e-3)]
    if arm == "symo":  # per-head gauge on W_Q, W_K; the rest to the built-in AdamW (Adam's settings)
        return [symo.Symo(named, "mod_add_qk_gauge", lr=1e-3, adamw_lr=1e-3, adamw_betas=(0.9, 0.999))]
    raise ValueError(f"unknown arm {arm!r}; choose from {ARMS}")


def qk_products(model: ModAdd) -> list[torch.Tensor]:
    out = []
    for blk in model.blocks:
        for h in range(HEADS):
            rows = slice(h * DH, (h + 1) * DH)
            out.append(blk.attn.q.weight[rows].T @ blk.attn.k.weight[rows])
    return out


@torch.no_grad()
def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / ((a.norm() + b.norm()) / 2).clamp_min(1e-30))


def run_arm(arm: str, steps: int = 1500, twin_seeds: tuple[int, ...] = TWIN_SEEDS,
            identity: bool | None = None) -> dict:
    """Train the base network, one rotated twin per seed in `twin_seeds`, the noise twin and (for Adam) the
    identity twin in lockstep; `logit_distance`/`qk_distance` are means over the rotated twins, and the
    per-seed curves are kept under `*_by_seed`."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    (xt, yt), (xv, yv) = data()
    torch.manual_seed(42)
    base = ModAdd()
    twins = [f"twin{s}" for s in twin_seeds]
    models = {"base": base, **{k: rotate_twin(base, s) for k, s in zip(twins, twin_seeds)}, "noise": noise_twin(base)}
    if identity if identity is not None else arm == "adam":
        models["identity"] = copy.deepcopy(base)
    opts = {k: make_optimizer(arm, m) for k, m in models.items()}
    rec: dict = {"steps": [], "logit_distance": [], "qk_distance": [], "noise_logit_distance": [],
                 "noise_qk_distance": [], "identity_logit_distance": [], "val_acc_base": [], "val_acc_twin": [],
                 "train_loss_base": [], "twin_seeds": list(twin_seeds),
                 "logit_distance_by_seed": {str(s): [] for s in twin_seeds},
                 "qk_distance_by_seed": {str(s): [] for s in twin_seeds}}
    marks = [s for s in METRIC_STEPS if s <= steps] + ([steps] if steps not in METRIC_STEPS else [])
    bar = tqdm(total=steps, desc=arm, leave=False, mininterval=30)
    for t in range(steps + 1):
        if t in marks:
            with torch.no_grad():
                logits = {k: m(xv) for k, m in models.items()}
                qk = {k: qk_products(m) for k, m in models.items()}

                def qk_rel(other: str, qk: dict = qk) -> float:
                    return sum(rel(a, b) for a, b in zip(qk["base"], qk[other])) / len(qk["base"])

                rec["steps"].append(t)
                for k, s in zip(twins, twin_seeds):
                    rec["logit_distance_by_seed"][str(s)].append(rel(logits["base"], logits[k]))
                    rec["qk_distance_by_seed"][str(s)].append(qk_rel(k))
                rec["logit_distance"].append(sum(rel(logits["base"], logits[k]) for k in twins) / len(twins))
                rec["qk_distance"].append(sum(qk_rel(k) for k in twins) / len(twins))
                rec["noise_logit_distance"].append(rel(logits["base"], logits["noise"]))
                rec["noise_qk_distance"].append(qk_rel("noise"))
                if "identity" in models:
                    rec["identity_logit_distance"].append(rel(logits["base"], logits["identity"]))
                rec["val_acc_base"].append(float((logits["base"].argmax(-1) == yv).float().mean()))
                rec["val_acc_twin"].append(float((logits[twins[0]].argmax(-1) == yv).float().mean()))
                rec["train_loss_base"].append(float(F.cross_entropy(base(xt), yt)))
        if t == steps:
            break
        for k, m in models.items():
            for o in opts[k]:
                o.zero_grad(set_to_none=True)
            F.cross_entropy(m(xt), yt).backward()
            for o in opts[k]:
                o.step()
        bar.update(1)
    bar.close()
    if not rec["identity_logit_distance"]:
        del rec["identity_logit_distance"]
    return {"arm": arm, **rec}


def _task(job: dict) -> dict:
    """One arm, in a worker of the harness's pool."""
    return run_arm(*job["task"])


def render_md(data: dict, command: str) -> str:
    arms = [a for a in ARMS if a in data]
    seeds = ", ".join(str(x) for x in data[arms[0]].get("twin_seeds", [777]))
    lines = ["# Gauge twins in a transformer (modular addition mod 47)", "",
             "Relative distance ||a - b|| / ((||a|| + ||b||) / 2) between a network and its twin whose every head's "
             f"W_Q, W_K rows were rotated by one Haar A_h (seeds {seeds}; distances are means over these twins, "
             "the last column gives each twin's end value): validation logits, and W_Q,h^T W_K,h averaged "
             "over the 8 heads. The noise twin adds N(0, 1e-7^2) to W_Q, W_K instead (a chaos baseline).", "",
             f"Command: `{command}`", "",
             "| arm | logit dist. step 1 | logit dist. end | W_Q^T W_K dist. step 1 | W_Q^T W_K dist. end | "
             "noise-twin logit dist. end | val acc base / twin (end) | logit dist. end per twin seed |",
             "|---|---|---|---|---|---|---|---|"]
    for a in arms:
        d = data[a]
        i1 = d["steps"].index(1) if 1 in d["steps"] else 0
        lines.append(f"| {a} | {d['logit_distance'][i1]:.2e} | {d['logit_distance'][-1]:.2e} | "
                     f"{d['qk_distance'][i1]:.2e} | {d['qk_distance'][-1]:.2e} | {d['noise_logit_distance'][-1]:.2e} | "
                     f"{d['val_acc_base'][-1]:.3f} / {d['val_acc_twin'][-1]:.3f} | "
                     + ", ".join(f"{v[-1]:.2e}" for v in d.get("logit_distance_by_seed", {}).values()) + " |")
    lines += ["", "Full curves (steps " + ", ".join(str(s) for s in data[arms[0]]["steps"]) + "):", ""]
    for a in arms:
        d = data[a]
        lines.append(f"- {a}: logit " + ", ".join(f"{v:.1e}" for v in d["logit_distance"]) + "; qk "
                     + ", ".join(f"{v:.1e}" for v in d["qk_distance"]))
    if "adam" in data and "identity_logit_distance" in data["adam"]:
        lines.append(f"- identity twin (Adam): max logit distance {max(data['adam']['identity_logit_distance']):.1e}")
    for key in ("findings", "notes"):
        if key in data:
            lines += ["", f"## {key.capitalize()}", ""] + [f"- {x}" for x in data[key]]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for a in [a for a in ARMS if a in data]:
        d = data[a]
        xs = [max(s, 0.5) for s in d["steps"]]
        for ax, key in zip(axes, ("logit_distance", "qk_distance")):
            line, = ax.plot(xs, [max(v, 1e-17) for v in d[key]], "o-", ms=3, label=a)
            noise = "noise_logit_distance" if key == "logit_distance" else "noise_qk_distance"
            ax.plot(xs, [max(v, 1e-17) for v in d[noise]], ":", color=line.get_color())
    for ax, title in zip(axes, ("validation logits", "W_Q,h^T W_K,h (mean over heads)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("step (0 drawn at 0.5)")
        ax.set_title(f"twin distance: {title} (dotted: noise twin)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--twin-seeds", default=",".join(str(x) for x in TWIN_SEEDS),
                    help="rotation seeds of the twins (protocol: 777, 999, 1234)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    steps = args.steps or (12 if args.quick else 1500)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gauge_twins_")) if args.quick else RESULTS)
    arms = args.arms.split(",")
    command = "python -m benchmarks.gauge_twins " + " ".join(argv if argv is not None else sys.argv[1:])
    t0 = time.time()
    seeds = tuple(int(x) for x in args.twin_seeds.split(","))
    if args.quick and args.twin_seeds == ",".join(str(x) for x in TWIN_SEEDS):
        seeds = TWIN_SEEDS[:1]
    out.mkdir(parents=True, exist_ok=True)
    data: dict = {}

    def save(job: dict, result: dict) -> None:  # after every arm, so a cut-short run still leaves its finished arms
        data[result["arm"]] = {k: v for k, v in result.items() if k != "arm"}
        ordered = {a: data[a] for a in arms if a in data}
        write_results(out, "gauge_twins", render_md(ordered, command), ordered)
        plot(ordered, out / "gauge_twins.png")

    pool = RunPool(_task, RunCache(out / "gauge_twins_runs.json"), workers=args.workers, desc="twins")
    for a in arms:
        pool.submit({"key": f"{a}|steps={steps}|twins={','.join(map(str, seeds))}", "task": (a, steps, seeds)})
    pool.run(save)
    print(f"{time.time() - t0:.0f} s")
    print((out / "gauge_twins.md").read_text())
    return {a: data[a] for a in arms}


if __name__ == "__main__":
    main()
