"""The named presets (symo.PRESETS) against references written here from their published algorithms.

- notebook: the authors' prototype algorithm for one signed-permutation hidden space on a bias-free MLP,
  written out below with numpy (float64 EMA with bias correction, square root by eigh with negative
  eigenvalues clamped to zero, pseudo-inverse of the root), lr alpha * beta^t, no momentum.
- muon: the reference Muon bit for bit, square layers included (tests/test_optim_backends.py).
- shampoo: a running sum started at eps I and its exact inverse square root, per block.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import rel
from torch import nn

from symo import PRESETS, Symo, SymoConfig
from symo.train.models import MLP

SPECS = Path(__file__).resolve().parent.parent / "specs"
HIDDEN_SPEC = """
name = "one signed-permutation hidden space"
[spaces]
h = { group = "signed_perm" }
[params]
"0.weight" = ["h", "_"]
"2.weight" = ["_", "h"]
"""


def teacher_student(n_in: int = 6, hidden: int = 12, n_out: int = 3, n: int = 64, seed: int = 0):
    """The paper's setup in small: bias-free tanh nets, N(0, 1/fan_in) weights, ill-conditioned inputs."""
    gen = torch.Generator().manual_seed(seed)

    def net() -> nn.Sequential:
        m = nn.Sequential(nn.Linear(n_in, hidden, bias=False), nn.Tanh(), nn.Linear(hidden, n_out, bias=False))
        for layer in (m[0], m[2]):
            layer.weight.data = torch.randn(layer.weight.shape, generator=gen) / layer.weight.shape[1] ** 0.5
        return m.double()

    student, teacher = net(), net()
    q, _ = torch.linalg.qr(torch.randn(n_in, n_in, generator=gen, dtype=torch.float64))
    x = torch.randn(n, n_in, generator=gen, dtype=torch.float64) @ (q * torch.logspace(0, -1, n_in).double()).T
    with torch.no_grad():
        y = teacher(x)
    return student, x, y


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (model(x) - y).pow(2).sum() / len(x) / 2


def prototype_step(w1, w2, g1, g2, state: dict, lr: float, beta: float = 0.95) -> tuple:
    """One step of the prototype: hidden unit j owns row j of W1 and column j of W2; the orbit average
    of g g^T over signed permutations of the hidden units is C (x) I with C = Y Y^T / hidden, Y the
    (n_in + n_out) x hidden matrix whose columns are the units' gradients."""
    import numpy as np

    hidden = w1.shape[0]
    y = np.concatenate([g1.T, g2], axis=0)                      # (n_in + n_out, hidden)
    c = y @ y.T / hidden
    state["t"] = state.get("t", 0) + 1
    state["m"] = beta * state.get("m", np.zeros_like(c)) + (1 - beta) * c
    m_hat = state["m"] / (1 - beta ** state["t"])
    evals, evecs = np.linalg.eigh(m_hat)
    root = (evecs * np.sqrt(np.clip(evals, 0, None))) @ evecs.T
    # numpy's default rcond (1e-15) keeps the rounding zeros of a rank-deficient statistic, whose roots
    # come out near sqrt(eps) ~ 1e-8 of the largest, and multiplies them by 1e8: noise at ~1e-6 of the
    # update that no other float64 evaluation reproduces. 1e-7 drops exactly those; every real direction
    # of these runs has a root above 1e-5 of the largest.
    update = np.linalg.pinv(root, rcond=1e-7, hermitian=True) @ y
    return w1 - lr * update[: w1.shape[1]].T, w2 - lr * update[w1.shape[1]:]


def test_notebook_preset_equals_the_prototype_algorithm_over_ten_steps():
    np = pytest.importorskip("numpy")
    student, x, y = teacher_student()
    ref = [student[0].weight.detach().numpy().copy(), student[2].weight.detach().numpy().copy()]
    opt = Symo(student.named_parameters(), HIDDEN_SPEC_PATH(), preset="notebook")
    assert opt.config.beta2 == 0.95 and opt.config.beta1 == 0.0 and opt.config.damping == 0.0
    alpha, beta = 0.09, 0.91
    state: dict = {}
    for t in range(10):
        lr = alpha * beta ** t
        for g in opt.param_groups:
            g["lr"] = lr
        # the prototype's gradient at its own weights (float64 numpy <-> torch, same loss)
        w1, w2 = (torch.from_numpy(w).requires_grad_() for w in ref)
        out = torch.tanh(x @ w1.T) @ w2.T
        g1, g2 = torch.autograd.grad((out - y).pow(2).sum() / len(x) / 2, (w1, w2))
        ref = list(prototype_step(ref[0], ref[1], g1.numpy(), g2.numpy(), state, lr))
        opt.zero_grad()
        loss_of(student, x, y).backward()
        opt.step()
        got = [student[0].weight.detach().numpy(), student[2].weight.detach().numpy()]
        for a, b in zip(got, ref):
            assert float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 1e-8, t
    with torch.no_grad():  # it trained
        assert float(loss_of(student, x, y)) < 0.5 * float(loss_of(teacher_student()[0], x, y))


def HIDDEN_SPEC_PATH():  # noqa: N802 - a parsed spec from the text above
    from symo import parse_spec

    return parse_spec(HIDDEN_SPEC)


def test_shampoo_preset_is_a_running_sum_from_eps_with_its_inverse_root():
    """preset="shampoo" on specs/muon.toml (one block per weight, coordinates Y = G^T, d = rows): after t
    steps the update is G_t (eps I + sum_k G_k^T G_k / rows)^{-1/2}, computed here by a dense float64 eigh."""
    torch.manual_seed(0)
    model = MLP((6, 10, 4), bias=False).double()
    opt = Symo(model.named_parameters(), SPECS / "muon.toml", preset="shampoo", lr=0.1)
    sums = {n: None for n, _ in model.named_parameters()}
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(16, 6, generator=gen, dtype=torch.float64), torch.randn(16, 4, generator=gen,
                                                                                  dtype=torch.float64)
    eps = PRESETS["shampoo"].values["damping"]
    for _ in range(4):
        opt.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        for n, p in model.named_parameters():
            g = grads[n]
            stat = g.T @ g / g.shape[0]
            sums[n] = stat if sums[n] is None else sums[n] + stat
            evals, evecs = torch.linalg.eigh(sums[n])
            want = g @ (evecs * (evals.clamp_min(0) + eps).pow(-0.5)) @ evecs.T
            assert rel((before[n] - p.detach()) / 0.1, want) < 1e-9, n


def test_explicit_options_override_the_preset_and_describe_names_them():
    model = MLP((6, 10, 8, 4))
    opt = Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset="notebook", beta2=0.99, lr=0.01)
    assert opt.config.beta2 == 0.99 and opt.config.beta1 == 0.0 and opt.param_groups[0]["lr"] == 0.01
    text = " ".join(line.strip() for line in opt.describe().splitlines())  # describe() wraps at 120 columns
    assert "preset 'notebook'" in text and "beta2=0.99 (preset: 0.95)" in text
    assert "differs in" in text and "damping=" not in text.split("differs in")[1].split(" learning rate")[0]
    plain = Symo(model.named_parameters(), SPECS / "mlp_tanh.toml").describe()
    assert "no preset" in plain and "no option differs" in plain


def test_lr_none_takes_the_presets_rate_and_the_default_otherwise():
    model = MLP((6, 10, 8, 4))
    for name, preset in PRESETS.items():
        opt = Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset=name)
        assert opt.param_groups[0]["lr"] == preset.lr, name
        assert opt.config.kind == preset.values["preconditioner"], name
        for key, value in preset.values.items():
            if key != "preconditioner":
                got = opt.config.flat()[key]  # an inner kind by its name, a matrix function's config by its spelling
                assert got == value or getattr(got, "label", None) == value, (name, key)
    published = Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset="published")
    assert published.preset.name == "published" and published.config.kind == "published"
    assert Symo(model.named_parameters(), SPECS / "mlp_tanh.toml").param_groups[0]["lr"] == 1e-3


def test_bad_preset_and_preset_with_config_are_clear_errors():
    model = MLP((6, 10, 8, 4))
    with pytest.raises(ValueError, match=r"unknown preset 'papr'.*'muon', 'notebook', 'published'"):
        Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset="papr")
    # "paper" is no preset: the published step is "published", the early notebooks' rule "notebook"
    with pytest.raises(ValueError, match=re.escape(f"unknown preset 'paper'; the presets are {sorted(PRESETS)}")):
        Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset="paper")
    with pytest.raises(ValueError, match="preset='notebook' or config=, not both"):
        Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", preset="notebook", config=SymoConfig())


def test_describe_with_a_config_and_no_preset_compares_with_the_defaults():
    model = MLP((6, 10, 8, 4))
    opt = Symo(model.named_parameters(), SPECS / "mlp_tanh.toml", config=SymoConfig(preconditioner="root", beta2=0.9),
               damping=0.0)
    text = " ".join(line.strip() for line in opt.describe().splitlines())
    assert "no preset" in text and "preconditioner='root' (default: 'polar')" in text
    assert "beta2=0.9 (default: 0.95)" in text and "damping=0.0 (default: 1e-06)" in text


def test_soap_muon_preset_is_then_orthogonalize_with_the_soap_inner_on_both_sides():
    """The preset is the campaign's SOAP-Muon arm (benchmarks/nanogpt_matrix_runs.py) under one name: the same
    configuration as the options written out, at Muon's rate."""
    from benchmarks.nanogpt_matrix_runs import SOAP_MUON

    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    spec = HIDDEN_SPEC_PATH()
    named = Symo(model.named_parameters(), spec, preset="soap_muon", strict=False)
    written = Symo(model.named_parameters(), spec, **SOAP_MUON, strict=False)
    assert named.config == written.config and type(named.config.inner).__name__ == "EigenAdamConfig"
    assert named.config.inner.two_sided and type(named.config.preconditioner).__name__ == "ThenOrthogonalizeConfig"
    assert PRESETS["soap_muon"].lr == PRESETS["muon"].lr == 0.02
