"""Every Symo option against an independent reference (tests/block_reference.py, tests/references.py).

The reference builds each isotypic block by hand from each space's irreducible pieces and takes every
matrix function by a dense float64 eigh, in a plain loop over steps. Each case runs several steps on a
float64 MLP whose spec has several blocks (coupled layers, a low-rank block, an invariant block), and
also runs the reference with the option under test switched to its neighbour: the library must match the
reference to 1e-9 and sit far (> 1e-3) from the neighbour, so an implementation that ignores the option fails by
a wide margin. (The matrix-function options, the Muon reduction and compile=True: test_optim_backends.py.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from block_reference import BlockLayout, ReferenceSymo  # noqa: E402
from cases import (
    FACTORED,
    MUON,
    PER_HEAD,
    RELU,
    SIZES,
    SPECS,
    TANH,
    bias_free_mlp_with_gradient,
    mlp_data,
    mse_loss,
    sensing_loss,
)
from helpers import assert_update_is_muons_polar, rel

from symo.optim import Symo
from symo.train.models import MLP, Factored

MLP_AXES = {"fc1.weight": ("h1", "_"), "fc1.bias": ("h1",), "fc2.weight": ("h2", "h1"), "fc2.bias": ("h2",),
            "fc3.weight": ("_", "h2"), "fc3.bias": ("_",)}
LAYOUTS = {
    # tanh: blocks {h1} = [W1^T; b1] (6 x 8), {h2} = [b2; W3] (4 x 6), {h1,h2} = vec W2 (1 x 48), invariant b3
    # (3 x 1: wider in multiplicity than in columns, the low-rank path)
    "tanh": (TANH, {"h1": "signed_perm", "h2": "signed_perm"}, MLP_AXES, True),
    # relu: perm spaces: standard blocks plus an invariant block holding b3 and every layer's means
    "relu": (RELU, {"h1": "perm", "h2": "perm"}, MLP_AXES, True),
    # Muon spec on a bias-free MLP: fc1 is 5 x 8 in block coordinates, fc2 and fc3 are low-rank (8 x 6, 6 x 3)
    "muon": (MUON, {"r1": "signed_perm", "r2": "signed_perm", "r3": "signed_perm"},
             {"fc1.weight": ("r1", "_"), "fc2.weight": ("r2", "_"), "fc3.weight": ("r3", "_")}, False),
}


def kind_options(options: dict) -> dict:
    """The reference's option names (beta2, source, estimator: tests/block_reference.py) as Symo's kind options:
    the taylor estimator is the taylor kind, a stored statistic (beta2 or a refresh schedule) the root kind,
    and neither the polar kind (Muon's step)."""
    out = {("statistic" if k == "source" else k): v for k, v in options.items() if k != "estimator"}
    if options.get("estimator") == "taylor":
        return {"preconditioner": "taylor", "beta2": 0.0, **out}
    if "beta2" in options or options.get("precondition_frequency", 1) > 1:
        return {"preconditioner": "root", "beta2": 0.0, **out}
    return out


def run_symo(layout: str, steps: int, lr: float, **options) -> dict[str, torch.Tensor]:
    spec, _, _, bias = LAYOUTS[layout]
    torch.manual_seed(0)
    model = MLP(SIZES, bias=bias).double()
    x, y = mlp_data()
    opt = Symo(model.named_parameters(), spec, lr=lr, **kind_options(options))
    assert set(opt.assignment.values()) == {"symo"}
    for _ in range(steps):
        opt.zero_grad()
        mse_loss(model, x, y).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def run_reference(layout: str, steps: int, lr: float, **options) -> dict[str, torch.Tensor]:
    _, spaces, axes, bias = LAYOUTS[layout]
    torch.manual_seed(0)
    model = MLP(SIZES, bias=bias).double()
    x, y = mlp_data()
    ref = ReferenceSymo(BlockLayout(spaces, axes, {n: tuple(p.shape) for n, p in model.named_parameters()}),
                        lr=lr, **options)
    for _ in range(steps):
        model.zero_grad()
        mse_loss(model, x, y).backward()
        new = ref.step({n: p.detach() for n, p in model.named_parameters()},
                       {n: p.grad for n, p in model.named_parameters()})
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(new[n])
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(rel(a[n], b[n]) for n in b)


# (id, layout, options, neighbour: the reference options an implementation ignoring the option would follow)
CASES = [
    ("defaults", "tanh", {}, {"power": -0.25}),
    ("defaults_perm", "relu", {}, {"power": -0.25}),
    ("nesterov_off", "tanh", {"beta1": 0.9, "nesterov": False}, {"beta1": 0.9, "nesterov": True}),
    ("nesterov_on", "tanh", {"beta1": 0.9, "nesterov": True}, {"beta1": 0.9, "nesterov": False}),
    ("no_momentum", "tanh", {"beta1": 0.0}, {"beta1": 0.95}),
    ("ema_bias_corrected", "tanh", {"beta2": 0.9}, {"beta2": 0.5}),
    ("running_sum", "tanh", {"beta2": 1.0}, {"beta2": 0.9}),
    ("frequency_3_ema", "tanh", {"beta2": 0.9, "precondition_frequency": 3},
     {"beta2": 0.9, "precondition_frequency": 1}),
    ("frequency_2_current", "relu", {"precondition_frequency": 2}, {"precondition_frequency": 1}),
    ("frequency_4_sum", "muon", {"beta2": 1.0, "precondition_frequency": 4},
     {"beta2": 1.0, "precondition_frequency": 2}),
    ("source_gradient_lowrank", "muon", {"beta1": 0.9, "source": "gradient"}, {"beta1": 0.9}),
    ("source_gradient_tanh", "tanh", {"beta1": 0.9, "source": "gradient"}, {"beta1": 0.9}),
    ("source_gradient_ema", "relu", {"beta1": 0.9, "beta2": 0.9, "source": "gradient"},
     {"beta1": 0.9, "beta2": 0.9}),
    ("power_quarter_ema", "tanh", {"beta2": 0.5, "power": -0.25}, {"beta2": 0.5}),
    ("power_one_current", "muon", {"power": -1.0, "damping": 1e-3}, {"power": -0.5, "damping": 1e-3}),
    ("power_three_quarters_lowrank", "muon", {"power": -0.75, "source": "gradient", "damping": 1e-2},
     {"power": -0.5, "source": "gradient", "damping": 1e-2}),
    ("relative_damping_per_block", "tanh", {"beta2": 0.9, "damping": 0.3},
     {"beta2": 0.9, "damping": 0.3, "global_lambda_max": True}),
    ("relative_damping_current", "relu", {"damping": 0.3}, {"damping": 0.3, "global_lambda_max": True}),
    ("absolute_damping_sum", "tanh", {"beta2": 1.0, "damping": 1e-2, "damping_mode": "absolute"},
     {"beta2": 1.0, "damping": 1e-2}),
    ("absolute_damping_lowrank", "muon", {"source": "gradient", "damping": 1e-3, "damping_mode": "absolute"},
     {"source": "gradient", "damping": 1e-3}),
    ("absolute_damping_current", "tanh", {"damping": 1e-2, "damping_mode": "absolute"}, {"damping": 1e-2}),
    ("taylor", "tanh", {"beta2": 0.9, "estimator": "taylor", "damping": 1e-3}, {"beta2": 0.9, "damping": 1e-3}),
    ("taylor_lowrank_blocks", "muon", {"beta2": 0.9, "estimator": "taylor", "damping": 1e-3},
     {"beta2": 0.9, "damping": 1e-3}),
    ("taylor_centred_perm", "relu", {"beta2": 0.9, "estimator": "taylor", "damping": 1e-3},
     {"beta2": 0.9, "estimator": "taylor", "damping": 1e-3, "centre_weights": False}),
    ("taylor_absolute_power", "tanh", {"beta2": 0.5, "estimator": "taylor", "damping": 1e-3,
                                       "damping_mode": "absolute", "power": -0.25},
     {"beta2": 0.5, "estimator": "taylor", "damping": 1e-3, "power": -0.25}),
    ("update_scale_muon", "tanh", {"update_scale": "muon"}, {}),
    ("update_scale_muon_per_block", "tanh", {"update_scale": "muon", "parameter_rms": False},
     {"update_scale": "muon"}),
    ("update_scale_muon_ema", "muon", {"update_scale": "muon", "beta2": 0.9}, {"beta2": 0.9}),
    ("update_scale_adamw", "tanh", {"update_scale": "adamw", "beta2": 0.5}, {"beta2": 0.5}),
    ("update_scale_adamw_rms", "relu", {"update_scale": "adamw", "adamw_rms": 0.05},
     {"update_scale": "adamw", "adamw_rms": 0.2}),
    ("weight_decay", "tanh", {"weight_decay": 0.5, "beta2": 0.5}, {"beta2": 0.5}),
]


@pytest.mark.parametrize("layout,options,neighbour", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_option_matches_reference_over_steps(layout, options, neighbour):
    steps, lr = 5, 0.05
    backend = {} if options.get("estimator") == "taylor" else {"backend": "eigh"}
    got = run_symo(layout, steps, lr, **backend, **options)
    want = run_reference(layout, steps, lr, **options)
    assert distance(got, want) < 1e-9
    assert distance(got, run_reference(layout, steps, lr, **neighbour)) > 1e-3


# ------------------------------------------------------------------------------------------ gauge twins
@pytest.mark.parametrize("options", [{}, {"beta1": 0.0, "damping": 0.0}, {"preconditioner": "root", "beta2": 0.9}])
def test_gauge_twins_on_the_default_path_and_adam_breaks_both_factors(options):
    """factored.toml with the defaults (beta2 = 0, the Muon-style path): (U Q, V Q) trains to (U_t Q, V_t Q)
    to 1e-10 for a random orthogonal Q; Adam's twins leave the orbit in U and in V."""
    loss = sensing_loss()
    torch.manual_seed(0)
    base = Factored(10, 8, 3).double()
    q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))
    twin = copy.deepcopy(base)
    with torch.no_grad():
        twin.U.copy_(base.U @ q)
        twin.V.copy_(base.V @ q)

    def run(model, opt):
        for _ in range(20):
            opt.zero_grad()
            loss(model).backward()
            opt.step()
        return model.U.detach(), model.V.detach()

    u0, v0 = run(a := copy.deepcopy(base), Symo(a.named_parameters(), FACTORED, lr=0.05, **options))
    u1, v1 = run(b := copy.deepcopy(twin), Symo(b.named_parameters(), FACTORED, lr=0.05, **options))
    assert rel(u0, base.U.detach()) > 1e-2 and rel(v0, base.V.detach()) > 1e-2   # it trained
    assert rel(u1, u0 @ q) < 1e-10 and rel(v1, v0 @ q) < 1e-10
    a0, b0 = run(c := copy.deepcopy(base), torch.optim.Adam(c.parameters(), lr=0.05))
    a1, b1 = run(d := copy.deepcopy(twin), torch.optim.Adam(d.parameters(), lr=0.05))
    assert rel(a1, a0 @ q) > 1e-2 and rel(b1, b0 @ q) > 1e-2


def test_geometric_mean_muon_scale_on_rectangular_layers():
    """Rows # columns specs with update_scale="muon": the first step of two-sided Shampoo is U V^T, and the
    muon scale gives sqrt(max(1, rows / cols)) U V^T (applied once, by the first spec) for tall and wide layers."""
    torch.manual_seed(0)
    model, x, y, grads, before = bias_free_mlp_with_gradient()
    opt = Symo(model.named_parameters(), SPECS / "shampoo_rows.toml", preconditioner="root", lr=1.0, beta1=0.0,
               beta2=1.0,
               geometric_mean_with=SPECS / "shampoo_cols.toml", damping=0.0, update_scale="muon")
    mse_loss(model, x, y).backward()
    opt.step()
    assert_update_is_muons_polar(model, grads, before, tol=1e-8)


def test_adamw_scale_is_per_head_for_batched_blocks():
    """update_scale="adamw" rescales each batch element of a block (one head of a per-head gauge) to RMS
    adamw_rms, not the batch as a whole: every head's rows of q/k and of v move at RMS 0.2."""
    import symo

    spec = symo.parse_spec("""
[spaces]
head = { group = "identity", size = 3 }
d = { group = "orthogonal", per = "head" }
[params]
"qk.weight" = ["(head d)", "_"]
""")
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(12, 5, dtype=torch.float64))
    opt = Symo({"qk.weight": w}, spec, lr=1.0, beta1=0.0, update_scale="adamw", adamw_rms=0.2)
    assert [(b.batch, b.mult, b.width) for b in opt.compiled.blocks] == [(3, 5, 4)]
    g = torch.randn(12, 5, dtype=torch.float64)
    g[:4] = torch.outer(torch.randn(4, dtype=torch.float64), torch.randn(5, dtype=torch.float64))  # rank 1
    g[4:8, 2:] = 0.0                                                                                # rank 2
    w.grad = g    # natural updates sqrt(d) U V^T: Frobenius norms sqrt(d rank) differ from head to head
    before = w.detach().clone()
    opt.step()
    upd = (before - w.detach()).reshape(3, 4, 5)
    rms = upd.square().mean(dim=(1, 2)).sqrt()
    assert torch.allclose(rms, torch.full((3,), 0.2, dtype=torch.float64), rtol=1e-12, atol=0)


SPLIT_HEADS = """
[spaces]
"d{i}" = "orthogonal"
[params]
"w{i}" = ["d{i}", "_"]
"""


@pytest.mark.parametrize("options", [{}, {"beta2": 0.9, "estimator": "taylor", "damping": 1e-3},
                                     {"beta2": 0.9, "update_scale": "adamw"}, {"beta1": 0.9, "source": "gradient"},
                                     {"beta2": 0.5, "precondition_frequency": 2, "power": -0.25, "damping": 1e-2},
                                     *({"preset": "then_orthogonalize", "inner": inner, "backend": "eigh",
                                        "stats_dtype": "float64", "precondition_frequency": 2}
                                       for inner in ("root", "eigen_adam"))])
def test_a_batched_block_equals_its_heads_as_separate_blocks(options):
    """One weight with a per-head O(4) gauge (a block of batch 3) trains exactly like three weights with a
    gauge each (three blocks of batch 1): every path treats each batch element as its own block (for
    then_orthogonalize: the rescale to ||u|| and the polar factor are per head)."""
    import symo

    gen = torch.Generator().manual_seed(12)
    x, y = torch.randn(16, 5, generator=gen, dtype=torch.float64), torch.randn(16, 12, generator=gen,
                                                                             dtype=torch.float64)
    w0 = torch.randn(12, 5, generator=gen, dtype=torch.float64)
    w0[:4] *= 10.0                                   # heads of different scales
    joint = torch.nn.Parameter(w0.clone())
    parts = [torch.nn.Parameter(w0[4 * i:4 * i + 4].clone()) for i in range(3)]
    symo_options = options if "preset" in options else kind_options(options)
    opts = [Symo({"w": joint}, symo.parse_spec(PER_HEAD), lr=0.05, **symo_options),
            Symo({f"w{i}": p for i, p in enumerate(parts)}, symo.parse_spec(SPLIT_HEADS), lr=0.05, **symo_options)]
    assert [b.batch for b in opts[0].compiled.blocks] == [3] and len(opts[1].compiled.blocks) == 3
    for _ in range(4):
        for o, w in zip(opts, (joint, torch.cat(parts))):
            o.zero_grad()
            ((x @ w.T - y) ** 2).mean().backward()
            o.step()
    assert rel(torch.cat([p.detach() for p in parts]), joint.detach()) < 1e-10
    assert rel(joint.detach(), w0) > 1e-3


def test_muon_scale_of_exactly_two():
    """hidden_hidden.toml on 4 x 4 layers: each weight is one block with mult 1 and d = width = 16, so the muon
    scale at power -1/4 is 16^{-1/4} sqrt(16) = 2 exactly, and the first update is
    2 (||G||^2 / 16)^{-1/4} G = 4 G / ||G||^{1/2} (Muon's per-block factor alone, parameter_rms=False); with the
    per-parameter RMS each weight's update is G at RMS 1/sqrt(4): G / ||G|| x sqrt(16) / 2 = 2 G / ||G||."""
    torch.manual_seed(0)
    model = MLP((4, 4, 4, 4), bias=False).double()
    x = torch.randn(8, 4, dtype=torch.float64)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    for parameter_rms, want in ((False, lambda g: 4 * g / g.norm().sqrt()), (True, lambda g: 2 * g / g.norm())):
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n])
                p.grad = grads[n].clone()
        opt = Symo(model.named_parameters(), SPECS / "hidden_hidden.toml", preconditioner="root", lr=1.0,
                   beta1=0.0, beta2=0.5, damping=0.0, power=-0.25, update_scale="muon", parameter_rms=parameter_rms)
        opt.step()
        for n, g in grads.items():
            assert rel(before[n] - model.get_parameter(n).detach(), want(g)) < 1e-12, (parameter_rms, n)


