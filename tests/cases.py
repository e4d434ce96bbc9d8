"""Inputs shared by several test modules (a helper, not a test module: the tests import from here,
never from one another): spec paths and data of the optimizer tests, an MLP's hidden-space spec, a `{i}`
stack's spec and shapes, a small
training run's config, the Laplace tests' problem, PSD blocks for the linear algebra, and Hugging Face
GPT-2's spec written by hand."""

from __future__ import annotations

from pathlib import Path

import torch

from symo.train import TrainConfig
from symo.train.checkpoint import save_checkpoint
from symo.train.models import GPT, MLP, GPTConfig

F64 = torch.float64

# ---------------------------------------------------------------- the optimizer's tests
SPECS = Path(__file__).resolve().parent.parent / "specs"
TANH, RELU, MUON, FACTORED = (SPECS / f"{n}.toml" for n in ("mlp_tanh", "mlp_relu", "muon", "factored"))
SIZES = (5, 8, 6, 3)

PER_HEAD = """
[spaces]
head = { group = "identity", size = 3 }
d = { group = "orthogonal", per = "head" }
[params]
"w" = ["(head d)", "_"]
"""


def mlp_data(seed: int = 1):
    """Inputs and targets (16 rows, float64) for an MLP of SIZES."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(16, SIZES[0], generator=gen, dtype=torch.float64),
            torch.randn(16, SIZES[-1], generator=gen, dtype=torch.float64))


def mse_loss(model, x, y):
    """The mean squared error of model(x) against y."""
    return ((model(x) - y) ** 2).mean()


def bias_free_mlp_with_gradient():
    """A float64 bias-free MLP, its data, the gradient at its start (then zeroed) and its start weights."""
    model = MLP(SIZES, bias=False).double()
    x, y = mlp_data()
    mse_loss(model, x, y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return model, x, y, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def sensing_loss(m=10, n=8, k=3, count=60, seed=0):
    """Matrix sensing loss of a factored model W = model(): `count` Gaussian measurements of a rank-k target."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(count, m, n, generator=gen, dtype=torch.float64)
    target = torch.randn(m, k, generator=gen, dtype=torch.float64) @ torch.randn(k, n, generator=gen,
                                                                                    dtype=torch.float64)
    y = torch.einsum("imn,mn->i", a, target)
    return lambda model: ((torch.einsum("imn,mn->i", a, model()) - y) ** 2).mean()


def train(model, opt, steps: int = 3, batch: int = 4, length: int = 16) -> None:
    """A few steps of next-token prediction on random tokens of a 17-symbol vocabulary (a GPT's smoke run)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 17, (batch, length), generator=gen)
        logits = model(x)
        logits = logits[0] if isinstance(logits, tuple) else logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 17), x.roll(-1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


# ---------------------------------------------------------------- compiler
# an MLP's one hidden space h (fc1's rows, its bias, fc2's columns), its group left open (MLP_SPEC % "perm");
# fc2.bias is left uncovered
MLP_SPEC = """
[spaces]
h = "%s"
[params]
"fc1.weight" = ["h", "_"]
"fc1.bias" = ["h"]
"fc2.weight" = ["_", "h"]
"""

# a 3-layer MLP's two hidden spaces (fc2 maps h1 to h2), their groups left open:
# MLP2_SPEC.format(h1="perm", h2="perm"); fc2.bias follows h2, fc3's bias is left uncovered
MLP2_SPEC = """
[spaces]
h1 = "{h1}"
h2 = "{h2}"
[params]
"fc1.weight" = ["h1", "_"]
"fc1.bias" = ["h1"]
"fc2.weight" = ["h2", "h1"]
"fc2.bias" = ["h2"]
"fc3.weight" = ["_", "h2"]
"""

# a `{i}` stack of one space per layer, its group left open (FAMILY % "perm")
FAMILY = """
[spaces]
"h{i}" = { group = "%s" }
[params]
"layers.{i}.fc1.weight" = ["h{i}", "_"]
"layers.{i}.fc1.bias" = ["h{i}"]
"layers.{i}.fc2.weight" = ["_", "h{i}"]
"""


def stack_shapes(layers: int, n: int = 3) -> dict:
    """A `{i}` stack: fc1 (n x 2), its bias and fc2 (2 x n) per layer."""
    shapes = {}
    for i in range(layers):
        shapes |= {f"layers.{i}.fc1.weight": (n, 2), f"layers.{i}.fc1.bias": (n,), f"layers.{i}.fc2.weight": (2, n)}
    return shapes


# ---------------------------------------------------------------- symo train
def make_text(path: Path) -> Path:
    """A deterministic small corpus (a few thousand characters over a 20-letter alphabet)."""
    gen = torch.Generator().manual_seed(0)
    words = ["".join("abcdefghijklmnopqrst"[int(i)] for i in torch.randint(0, 20, (int(n),), generator=gen))
             for n in torch.randint(2, 7, (400,), generator=gen)]
    path.write_text("\n".join(" ".join(words[i:i + 8]) for i in range(0, 400, 8)) + "\n", encoding="utf-8")
    return path


def tiny(tmp_path: Path, **overrides) -> TrainConfig:
    """A `symo train` run of a few seconds on `make_text`'s corpus."""
    base = dict(data=str(make_text(tmp_path / "text.txt")), cache_dir=str(tmp_path / "cache"),
                out_dir=str(tmp_path / "run"), n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=8,
                steps=5, eval_interval=2, eval_batches=2, warmup=2, sample_chars=0, progress=False, threads=1)
    return TrainConfig(**{**base, **overrides})


# ---------------------------------------------------------------- Laplace
def make_problem(sizes, act: str, likelihood: str, n: int = 24, seed: int = 0):
    """A float64 MLP, its inputs and targets, and a loader of batches of 10."""
    torch.manual_seed(seed)
    model = MLP(sizes, act=act).double()
    x = torch.randn(n, sizes[0], dtype=F64)
    if likelihood == "classification":
        y = torch.randint(0, sizes[-1], (n,))
    else:
        y = torch.randn(n, sizes[-1], dtype=F64)
    loader = [(x[i:i + 10], y[i:i + 10]) for i in range(0, n, 10)]
    return model, x, y, loader


# ---------------------------------------------------------------- linear algebra
def blocks(m: int = 6, ranks=(6, 3, 6), scales=(1.0, 1e3, 1e-3), seed: int = 0) -> torch.Tensor:
    """A batch of PSD m x m blocks with the given ranks, scaled far apart."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for r, s in zip(ranks, scales):
        f = torch.randn(m, r, generator=gen, dtype=F64)
        out.append(s * f @ f.T / r)
    return torch.stack(out)


# ---------------------------------------------------------------- spec inference
# Hugging Face GPT-2 (Conv1D layout: weights are (in, out)), written by hand from the architecture
HF_GPT2_SPEC = """
[spaces]
res = "perm"
"head{i}" = { group = "identity" }
"dqk{i}" = { group = "orthogonal", per = "head{i}", size = 8 }
"dvo{i}" = { group = "orthogonal", per = "head{i}", size = 8 }
"mlp{i}" = "perm"
[params]
"transformer.wte.weight" = ["_", "res"]
"transformer.wpe.weight" = ["_", "res"]
"transformer.h.{i}.ln_{j}.weight" = ["res"]
"transformer.h.{i}.ln_{j}.bias" = ["res"]
"transformer.h.{i}.attn.c_attn.weight" = ["res", ["(head{i} dqk{i})", "(head{i} dqk{i})", "(head{i} dvo{i})"]]
"transformer.h.{i}.attn.c_attn.bias" = [["(head{i} dqk{i})", "(head{i} dqk{i})", "(head{i} dvo{i})"]]
"transformer.h.{i}.attn.c_proj.weight" = ["(head{i} dvo{i})", "res"]
"transformer.h.{i}.attn.c_proj.bias" = ["res"]
"transformer.h.{i}.mlp.c_fc.weight" = ["res", "mlp{i}"]
"transformer.h.{i}.mlp.c_fc.bias" = ["mlp{i}"]
"transformer.h.{i}.mlp.c_proj.weight" = ["mlp{i}", "res"]
"transformer.h.{i}.mlp.c_proj.bias" = ["res"]
"transformer.ln_f.weight" = ["res"]
"transformer.ln_f.bias" = ["res"]
"""


def gpt_checkpoints(tmp_path: Path, seeds=(0, 1)) -> tuple[list[str], dict]:
    """`symo train` checkpoints (run{seed}/ckpt.pt) of a 1-layer GPT, one per seed, and the options they record."""
    options = {"block_size": 8, "n_layer": 1, "n_head": 2, "n_embd": 32, "bias": True}
    paths = []
    for seed in seeds:
        torch.manual_seed(seed)
        gpt = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=5, block_size=8))
        paths.append(str(save_checkpoint(tmp_path / f"run{seed}" / "ckpt.pt", {
            "model": gpt.state_dict(), "optimizer": {}, "settings": {"vocab": "abcde"}, "options": options})))
    return paths, options


def relu_mlp_pair(seed: int = 1) -> tuple[MLP, MLP]:
    """Two float64 ReLU MLPs 4-6-6-3 (the `mlp_relu` spec's shape) to align: one from seed 0, one from `seed`."""
    torch.manual_seed(0)
    a = MLP((4, 6, 6, 3), act="relu").double()
    torch.manual_seed(seed)
    return a, MLP((4, 6, 6, 3), act="relu").double()
