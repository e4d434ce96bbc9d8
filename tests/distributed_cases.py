"""The small problems tests/test_distributed.py trains on one process and on 2 or 4 gloo processes (FSDP2 and
DDP), with what each run observes: the final parameters, each block's matrix-function calls on this rank,
and the collectives of each optimizer step (counted by wrapping torch.distributed's functions)."""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from benchmarks.distributed import counting_matrix_functions
from symo.optim import Symo
from symo.train.models import GPT, MLP
from symo.train.rnn import RNN

BATCH = 8  # divisible by 1, 2 and 4: every rank's slice has the same size, so averaged gradients agree
STEPS = 5


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    spec: str
    frozen: str
    """A covered parameter with requires_grad=False."""
    sizes: dict[str, int] | None = None
    options: dict[str, Any] = field(default_factory=lambda: {"preconditioner": "root", "beta2": 0.9, "damping": 1e-3})
    whole_batch: bool = False
    """Every rank trains on the whole batch rather than its slice, so the averaged gradient is one process's to the
    last bit: for optimizers that turn the sums' rounding into O(1) moves (SOAP's Adam step in a rotated basis)."""


class TwoBranches(nn.Module):
    """Two tanh MLPs on the same input, summed: `low` in float32 (made so by `build`), `high` in float64, so
    a step exchanges tensors of two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        self.low, self.high = MLP((8, 11, 4)), MLP((8, 7, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.low(x.float()).double() + self.high(x)


def _gpt(n_layer: int = 2) -> nn.Module:
    # d_model 10: c_attn has 30 rows, c_fc 40 and the vocabulary 11, so 4 ranks shard unevenly
    return GPT(n_layer=n_layer, n_head=2, n_embd=10, vocab_size=11, block_size=8)


CASES: dict[str, Case] = {
    "mlp_tanh": Case(lambda: MLP((8, 15, 13, 4)), "mlp_tanh", "fc2.bias"),
    "gpt_muon": Case(_gpt, "gpt_muon", "transformer.h.1.attn.c_proj.weight"),
    "gpt_muon_path": Case(_gpt, "gpt_muon", "transformer.h.1.attn.c_proj.weight",
                          options={"update_scale": "muon"}),
    "gpt_true": Case(_gpt, "gpt_true", "transformer.h.0.mlp.c_fc.bias", {"dqk{i}": 5, "dvo{i}": 5}),
    "rnn_tanh": Case(lambda: RNN(d_in=3, hidden=9, d_out=2), "rnn_tanh", "b_h"),
    # the raw gradient's statistics (its shards travel too), refreshed every other step
    "mlp_gradient": Case(lambda: MLP((8, 15, 13, 4)), "mlp_tanh", "fc2.bias",
                         options={"preconditioner": "root", "beta2": 0.9, "damping": 1e-3, "statistic": "gradient",
                                  "precondition_frequency": 2}),
    # two-sided Shampoo: two stages, whose blocks together make the components
    "shampoo_gm": Case(lambda: MLP((8, 15, 13, 4)), "shampoo_rows", "fc2.weight",
                       options={"preconditioner": "root", "beta2": 0.9, "damping": 1e-3,
                                "geometric_mean_with": "shampoo_cols"}),
    # SOAP-Muon, symo train's default step: both Kronecker sides of one spec, the first step skipped, QR refreshes
    # every other step
    "gpt_soap_muon": Case(_gpt, "gpt_muon", "transformer.h.1.attn.c_proj.weight",
                          options={"preset": "soap_muon", "stats_dtype": "float64", "precondition_frequency": 2},
                          whole_batch=True),
    # SOAP-Muon on gpt_muon_qkv (symo train's default spec): c_attn's 30 rows as three 10-row blocks, which 4 ranks'
    # shards cut across
    "gpt_qkv_soap_muon": Case(_gpt, "gpt_muon_qkv", "transformer.h.1.attn.c_proj.weight",
                              options={"preset": "soap_muon", "stats_dtype": "float64", "precondition_frequency": 2},
                              whole_batch=True),
    # NorMuon's rows after Muon's step: each rank normalizes its rows of a shard, and the norm it rescales to is the
    # whole matrix's (one all-reduce under FSDP2)
    "gpt_normuon": Case(_gpt, "gpt_muon", "transformer.h.1.attn.c_proj.weight",
                        options={"update_scale": "muon", "neuron_norm_beta2": 0.9}),
    # two dtypes: one exchange per dtype each way
    "mixed_dtypes": Case(TwoBranches, "two_branches", "high.fc1.bias"),
    # collectives must not grow with the parameters: the same MLP, three times deeper
    "mlp_deep": Case(lambda: MLP((8, 15, 13, 11, 9, 7, 6, 4)), "mlp_tanh_deep", "fc2.bias"),
}


def deep_spec() -> str:
    """The tanh MLP spec for seven layers (the bundled one is written for three)."""
    spaces = "\n".join(f'h{i} = {{ group = "signed_perm" }}' for i in range(1, 7))
    rows = ['"fc1.weight" = ["h1", "_"]', '"fc1.bias" = ["h1"]']
    for i in range(2, 7):
        rows += [f'"fc{i}.weight" = ["h{i}", "h{i - 1}"]', f'"fc{i}.bias" = ["h{i}"]']
    rows += ['"fc7.weight" = ["_", "h6"]', '"fc7.bias" = ["_"]']
    return 'name = "deep tanh MLP"\n\n[spaces]\n' + spaces + "\n\n[params]\n" + "\n".join(rows) + "\n"


def two_branches_spec() -> str:
    """Each branch's hidden units as a signed_perm space (the bundled tanh MLP spec, once per branch)."""
    rows = []
    for branch in ("low", "high"):
        rows += [f'"{branch}.fc1.weight" = ["{branch}", "_"]', f'"{branch}.fc1.bias" = ["{branch}"]',
                 f'"{branch}.fc2.weight" = ["_", "{branch}"]']
    return ('name = "two branches"\n\n[spaces]\nlow = { group = "signed_perm" }\nhigh = { group = "signed_perm" }'
            "\n\n[params]\n" + "\n".join(rows) + "\n")


def batch(name: str, step: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1000 + step)
    if name.startswith("gpt"):
        idx = torch.randint(0, 11, (BATCH, 8), generator=gen)
        return idx, torch.randint(0, 11, (BATCH, 8), generator=gen)
    if name.startswith("rnn"):
        return torch.randn(BATCH, 5, 3, generator=gen, dtype=torch.float64), torch.randn(BATCH, 2, generator=gen,
                                                                                         dtype=torch.float64)
    width = 8
    return torch.randn(BATCH, width, generator=gen, dtype=torch.float64), torch.randn(BATCH, 4, generator=gen,
                                                                                      dtype=torch.float64)


def loss_of(name: str, model: nn.Module, data: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if name.startswith("gpt"):
        return model(data[0], data[1])[1]
    return (model(data[0]) - data[1]).square().mean()


def build(name: str, spec_dir: str, seed: int = 0) -> tuple[nn.Module, Case]:
    case = CASES[name]
    torch.manual_seed(seed)
    model = case.build().double()
    if isinstance(model, TwoBranches):
        model.low.float()
    model.get_parameter(case.frozen).requires_grad_(False)
    return model, case


def make_optimizer(name: str, model: nn.Module, case: Case, spec_dir: str, mode: str) -> Symo:
    named = list(model.named_parameters())
    half = len(named) // 2  # two groups: other rates and weight decay
    groups = [{"params": named[:half], "lr": 0.02}, {"params": named[half:], "lr": 0.01, "weight_decay": 0.1,
                                                     "adamw_lr": 0.002}]
    spec = os.path.join(spec_dir, f"{case.spec}.toml") if case.spec in ("mlp_tanh_deep", "two_branches") else case.spec
    return Symo(groups, spec, sizes=case.sizes, distributed_mode=mode, **case.options)


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()}


@contextlib.contextmanager
def counting_collectives(counts: list[str]):
    """Record the name of each torch.distributed collective called inside."""
    names = ["all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
             "broadcast", "reduce_scatter_tensor", "gather", "scatter", "send", "recv", "barrier"]
    saved = {n: getattr(dist, n) for n in names}

    def wrap(n, fn):
        def counted(*a, **k):
            counts.append(n)
            return fn(*a, **k)
        return counted

    for n, fn in saved.items():
        setattr(dist, n, wrap(n, fn))
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


def wrap(model: nn.Module, mode: str) -> nn.Module:
    """fully_shard every transformer block / linear layer and the root, or DDP around the whole model."""
    if mode == "replicated":
        return DistributedDataParallel(model)
    blocks = [m for m in model.modules() if m.__class__.__name__ == "Block"]
    for m in blocks or [m for m in model.modules() if isinstance(m, nn.Linear)]:
        fully_shard(m)
    fully_shard(model)
    return model


def train(name: str, spec_dir: str, mode: str, steps: range = range(STEPS), model=None, opt=None,
          record: dict | None = None) -> tuple[nn.Module, Symo]:
    """`mode` "off": one process on the whole batch; "fsdp" / "replicated": this rank's slice."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if model is None:
        model, case = build(name, spec_dir)
        if mode != "off":
            model = wrap(model, mode)
        inner = model.module if mode == "replicated" else model
        opt = make_optimizer(name, inner, case, spec_dir, mode)
    record = {} if record is None else record
    calls, collectives = record.setdefault("calls", Counter()), record.setdefault("collectives", [])
    for step in steps:
        data = batch(name, step)
        if mode != "off" and not CASES[name].whole_batch:
            rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
            data = tuple(t[rows] for t in data)
        opt.zero_grad()
        loss_of(name, model, data).backward()
        seen: list[str] = []
        with counting_matrix_functions(calls), counting_collectives(seen):
            opt.step()
        collectives.append(len(seen))
    return model, opt


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
