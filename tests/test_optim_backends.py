"""The matrix-function options against references: the auto backend's eigh / Newton–Schulz switch, the
Newton–Schulz steps and coefficients, Muon's scale on the exact backend, the Muon reduction bit for bit against
tests/references.py's Muon, and compile=True against the eager step. (Every other option against the block
reference: test_optim_options.py.)"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from cases import MUON, bias_free_mlp_with_gradient, mlp_data, mse_loss
from helpers import assert_update_is_muons_polar, ref_power, rel
from references import ReferenceMuon, newton_schulz

from symo.optim import Symo, SymoConfig
from symo.train.models import MLP


def test_auto_backend_switches_to_newton_schulz_above_eigh_max_size():
    """auto: Gram sides above eigh_max_size use Newton–Schulz, the rest eigh (the boundary included).

    Muon path (Gram side min(mult, width)): fc1 5 x 8 and fc3 6 x 3 stay exact, sqrt(rows) U V^T;
    fc2 (8 x 6, Gram side 6 > 5) is sqrt(rows) times Muon's quintic of G, far from the exact polar factor.
    """
    torch.manual_seed(0)
    model, x, y, grads, before = bias_free_mlp_with_gradient()
    opt = Symo(model.named_parameters(), MUON, lr=1.0, beta1=0.0, damping=0.0, eigh_max_size=5)
    report = opt.describe()
    assert "backend=newton_schulz (iterate); fc2.weight" in report
    assert "backend=eigh; fc1.weight" in report and "backend=eigh; fc3.weight" in report
    mse_loss(model, x, y).backward()
    opt.step()
    upd = {n: before[n] - p.detach() for n, p in model.named_parameters()}
    for n, g in grads.items():
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        exact = math.sqrt(g.shape[0]) * u @ vh
        quintic = math.sqrt(g.shape[0]) * newton_schulz(g, dtype=torch.float64)
        if n == "fc2.weight":
            assert rel(upd[n], quintic) < 1e-12 and rel(upd[n], exact) > 1e-2, n
        else:
            assert rel(upd[n], exact) < 1e-10, n


def auto_backend(cfg: SymoConfig, mult: int, device: torch.device, dtype: torch.dtype, width: int = 10_000) -> str:
    from symo.optim.kinds import KINDS
    from symo.runtime.compiled import BlockInfo

    block = BlockInfo("b", "test", 1, mult, width, width, str(width), ("w",))
    return KINDS[cfg.kind][1](cfg).backend_for(block, 0, device, dtype).label  # its matrix function's name


def test_auto_backend_rule_for_stored_statistics():
    """root kind, auto: the coupled iteration only on an accelerator, above eigh_max_size, with relative
    damping at or above its accuracy floor for the statistics' dtype; eigh everywhere else."""
    cfg = SymoConfig(preconditioner="root", beta2=0.9, damping=1e-6, eigh_max_size=128)
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    f64, f32 = torch.float64, torch.float32
    assert auto_backend(cfg, 129, gpu, f64) == "newton_schulz"
    assert auto_backend(cfg, 128, gpu, f64) == "eigh"             # the boundary stays exact
    assert auto_backend(cfg, 4096, cpu, f64) == "eigh"            # CPU: eigh is cheaper
    assert auto_backend(cfg, 4096, gpu, f32) == "eigh"            # 1e-6 < float32 floor 1.2e-5
    assert auto_backend(cfg.replace(damping=1e-4), 4096, gpu, f32) == "newton_schulz"
    assert auto_backend(cfg.replace(damping=0.0), 4096, gpu, f64) == "eigh"   # no pseudo-inverse by NS
    assert auto_backend(cfg.replace(damping_mode="absolute"), 4096, gpu, f64) == "eigh"
    assert auto_backend(cfg.replace(power=-0.75), 4096, gpu, f64) == "eigh"
    muon = SymoConfig(damping=0.0)
    assert auto_backend(muon, 4096, cpu, f64) == "newton_schulz"  # Muon's quintic never diverges


def test_newton_schulz_backend_for_stored_statistics_is_the_coupled_inverse_root():
    """beta2 > 0, backend="newton_schulz": (A + damping ||A||_F I)^{-1/2} from the coupled iteration on every
    block (damping 0.05 is above the iteration's accuracy floor); auto on CPU: the eigh pseudo-inverse with
    damping * lambda_max on every block."""
    torch.manual_seed(0)
    damping = 0.05
    for backend in ("newton_schulz", "auto"):
        model, x, y, grads, before = bias_free_mlp_with_gradient()
        opt = Symo(model.named_parameters(), MUON, preconditioner="root", lr=1.0, beta1=0.0, beta2=0.9, damping=damping,
                   eigh_max_size=6, ns_inverse_steps=60, backend=backend)
        assert f"backend={'newton_schulz' if backend != 'auto' else 'eigh'}; fc2.weight" in opt.describe()
        mse_loss(model, x, y).backward()
        opt.step()
        for n, g in grads.items():
            upd = (before[n] - model.get_parameter(n).detach()).T        # block coordinates: Y = G^T
            a = g.T @ g / g.shape[0]                                      # bias-corrected EMA after one step
            frob = float(torch.sqrt((a * a).sum()))
            want = ref_power(a + damping * frob * torch.eye(len(a), dtype=a.dtype), -0.5) @ g.T
            lam = ref_power(a, -0.5, damping) @ g.T                 # what a lambda_max convention gives
            if backend == "newton_schulz":
                assert rel(upd, want) < 1e-10 and rel(upd, lam) > 1e-3, n
            else:
                assert rel(upd, lam) < 1e-10, n


@pytest.mark.parametrize("steps,coeffs", [(3, (3.4445, -4.7750, 2.0315)), (12, (1.5, -0.5, 0.0))])
def test_ns_steps_and_coeffs_reach_the_polar_iteration(steps, coeffs):
    """newton_schulz backend, muon scale: sqrt(max(1, rows/cols)) NS(G) with the given steps and coefficients,
    against the reference quintic; the cubic (1.5, -0.5, 0) converges towards the exact polar factor."""
    torch.manual_seed(0)
    model = MLP((5, 8, 6, 3), bias=False).double()
    x, y = mlp_data()
    mse_loss(model, x, y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = Symo(model.named_parameters(), MUON, lr=1.0, beta1=0.0, backend="newton_schulz", update_scale="muon",
               ns_steps=steps, ns_coeffs=coeffs)
    mse_loss(model, x, y).backward()
    opt.step()
    for n, g in grads.items():
        upd = before[n] - model.get_parameter(n).detach()
        want = max(1.0, g.shape[0] / g.shape[1]) ** 0.5 * newton_schulz(g, steps, coeffs, dtype=torch.float64)
        default = max(1.0, g.shape[0] / g.shape[1]) ** 0.5 * newton_schulz(g, dtype=torch.float64)
        assert rel(upd, want) < 1e-12 and rel(upd, default) > 1e-3, n


def test_update_scale_muon_on_the_exact_backend_is_muons_scale():
    """eigh backend, muon scale: sqrt(max(1, rows / cols)) U V^T, for a tall (8 x 5), a wide (6 x 8) and a
    3 x 6 layer; the natural scale would be sqrt(rows) U V^T."""
    torch.manual_seed(0)
    model, x, y, grads, before = bias_free_mlp_with_gradient()
    opt = Symo(model.named_parameters(), MUON, lr=1.0, beta1=0.0, damping=0.0, backend="eigh", update_scale="muon")
    mse_loss(model, x, y).backward()
    opt.step()
    assert_update_is_muons_polar(model, grads, before, tol=1e-10)


@pytest.mark.parametrize("sizes,options", [
    ((8, 16, 12, 4), {"lr": 0.02, "backend": "newton_schulz", "update_scale": "muon"}),
    ((8, 16, 16, 4), {"preset": "muon"}),   # a square layer: iterated as G, in Muon's orientation, not G^T
])
def test_muon_reduction_is_bit_for_bit(sizes, options):
    """The README's claim: muon.toml, newton_schulz backend, muon scale (or preset="muon"), float32 = the
    reference Muon (tests/references.py) on the weights and torch's single-tensor AdamW on the biases, over
    10 steps, every parameter equal bit for bit."""
    torch.manual_seed(0)
    m1 = MLP(sizes)
    m2 = copy.deepcopy(m1)
    start, start_bias = m1.fc1.weight.detach().clone(), m1.fc1.bias.detach().clone()
    opt = Symo(m1.named_parameters(), MUON, weight_decay=0.01, adamw_lr=0.01, adamw_wd=0.01, **options)
    assert opt.param_groups[0]["lr"] == 0.02
    refs = [ReferenceMuon([p for n, p in m2.named_parameters() if n.endswith("weight")], lr=0.02, momentum=0.95,
                          nesterov=True, weight_decay=0.01),
            torch.optim.AdamW([p for n, p in m2.named_parameters() if n.endswith("bias")], lr=0.01,
                              betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, foreach=False)]
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    for _ in range(10):
        for model, opts in ((m1, [opt]), (m2, refs)):
            for o in opts:
                o.zero_grad()
            mse_loss(model, x, y).backward()
            for o in opts:
                o.step()
    assert not torch.equal(m1.fc1.weight, start) and not torch.equal(m1.fc1.bias, start_bias)   # both kinds moved
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), n


@pytest.mark.torch_compile
def test_compile_true_matches_the_eager_step_bit_for_bit(monkeypatch):
    """compile=True hands the Muon hot path to torch.compile(fullgraph=True); traced with the eager backend
    (inductor needs a C++ toolchain and minutes) the 4 steps equal the uncompiled optimizer bit for bit."""
    calls = []
    real = torch.compile

    def recording_compile(fn, **kwargs):
        calls.append((fn.__name__, kwargs))
        return real(fn, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(torch, "compile", recording_compile)
    torch.manual_seed(0)
    m1 = MLP((8, 256, 640, 4))  # fc2 (640 x 256, Y 256 x 640): the spectral form (auto on CPU) is traced too
    m2 = copy.deepcopy(m1)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
    opts = [Symo(m.named_parameters(), MUON, lr=0.02, backend="newton_schulz", compile=c)
            for m, c in ((m1, True), (m2, False))]
    for _ in range(4):
        for model, o in zip((m1, m2), opts):
            o.zero_grad()
            mse_loss(model, x, y).backward()
            o.step()
    assert calls == [("polar_step", {"fullgraph": True})]
    assert "backend=newton_schulz (spectral); fc2.weight" in opts[0].describe()
    for (n, a), b in zip(m1.named_parameters(), m2.parameters()):
        assert torch.equal(a, b), n
