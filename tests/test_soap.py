"""SOAP inside Symo, against the libraries themselves (never a reference written in Symo's conventions):

- `preset="soap"` on a one-sided Muon-style spec is pytorch-optimizer's `SOAP` (a line-by-line port of the
  authors' code) on the same model: 30 float64 steps with several refreshes, to 1e-4 of the distance moved;
- `preset="soap_heavyball"` is heavyball's `SOAP` (its own conventions and defaults) the same way, in float32;
- SOAP-Muon (`then_orthogonalize` with the SOAP inner) is the polar factor of that library's SOAP direction;
- the conventions one at a time: the first step moves nothing; `PowerQR` against dense eigendecompositions;
- SOAP-Muon's `eigenbasis_power=0.5` (the SOAP authors' SOAP-Muon code) is the signed root of the polar factor's
  coordinates in that library's own eigenbasis;
- float32 and bfloat16 on rank-deficient, ill-conditioned gradients: never a NaN (soap, the default soap_muon, and
  soap_muon with eigenbasis_power 0.5).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from helpers import assert_polar_of_the_librarys_direction, polar, rel

import symo
from symo.optim import Symo
from symo.optim.bases import Eigh, PowerQR
from symo.runtime.linalg import power_qr_basis

pytorch_optimizer = pytest.importorskip("pytorch_optimizer")

F64 = torch.float64
MUON_STYLE = '[spaces]\n"r{i}" = "signed_perm"\n[params]\n"{i}.weight" = ["r{i}", "_"]\n'


def square_mlp(width: int = 6, dtype: torch.dtype = F64) -> torch.nn.Module:
    """Bias-free square layers: every Kronecker statistic of a batch gradient has full rank from the first step
    (a non-square weight's larger side has null directions, whose eigh basis is arbitrary in any library)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width, bias=False, dtype=dtype), torch.nn.Tanh(),
                               torch.nn.Linear(width, width, bias=False, dtype=dtype))


def run_side_by_side(a: torch.nn.Module, opt_a, b: torch.nn.Module, opt_b, steps: int) -> list[float]:
    """Both models trained on the same regression batch; per step, ||w_a - w_b|| / ||w_b - w_b(0)||."""
    dtype = next(a.parameters()).dtype
    torch.manual_seed(1)
    x = torch.randn(64, 6, dtype=dtype)
    y = torch.randn(64, 6, dtype=dtype)
    start = [p.detach().clone() for p in b.parameters()]
    gaps = []
    for _ in range(steps):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
        moved = sum(float((p.detach() - q).norm() ** 2) for p, q in zip(b.parameters(), start)) ** 0.5
        gap = sum(float((p.detach() - q.detach()).norm() ** 2) for p, q in zip(a.parameters(), b.parameters())) ** 0.5
        gaps.append(gap / moved if moved > 0 else gap)
    return gaps


@pytest.mark.parametrize("frequency", [3, 10])
def test_soap_preset_is_pytorch_optimizers_soap(frequency):
    """One Muon-style spec gives both of SOAP's sides; the library keeps its own defaults (betas 0.95, shampoo_beta
    0.95, eps 1e-8, bias correction); its QR runs in float32, so the gap after a refresh is ~1e-6, not 1e-12."""
    a, b = square_mlp(), square_mlp()
    opt_a = Symo(a.named_parameters(), symo.parse_spec(MUON_STYLE), preset="soap", lr=0.01, weight_decay=0.0,
                 precondition_frequency=frequency, stats_dtype="float64")
    opt_b = pytorch_optimizer.SOAP(b.parameters(), lr=0.01, weight_decay=0.0, precondition_frequency=frequency)
    gaps = run_side_by_side(a, opt_a, b, opt_b, 30)
    assert max(gaps) < 1e-4, gaps
    assert gaps[0] == 0.0  # the first step moves neither


def test_soap_heavyball_preset_is_heavyballs_soap():
    """`preset="soap_heavyball"` against heavyball's `SOAP` with its defaults (betas (0.9, 0.95), refresh every 2,
    eps clamp, shifted QR), 30 steps, to 1e-4 of the distance moved. In float32: heavyball keeps its state in
    float32 and refuses float64 parameters there. eps is 1e-3 in both, because in float32 the rotated gradient's
    rounding noise (~1e-7 of its size) would otherwise be divided by eps and decide the trajectory (as it does in
    any two float32 implementations); the eps=1e-3 check shows the conventions agree."""
    pytest.importorskip("heavyball")
    import heavyball.utils  # its SOAP without torch.compile, as the campaign runs it

    heavyball.utils.compile_mode = None
    a, b = square_mlp(dtype=torch.float32), square_mlp(dtype=torch.float32)
    opt_a = Symo(a.named_parameters(), symo.parse_spec(MUON_STYLE), preset="soap_heavyball", lr=0.01, eps=1e-3)
    opt_b = heavyball.SOAP(list(b.parameters()), lr=0.01, weight_decay=0.0, eps=1e-3)
    gaps = run_side_by_side(a, opt_a, b, opt_b, 30)
    assert max(gaps) < 1e-4, gaps
    opt_a = Symo(a.named_parameters(), symo.parse_spec(MUON_STYLE), preset="soap", lr=0.01, eps=1e-3)  # the authors'
    opt_b = heavyball.SOAP(list(b.parameters()), lr=0.01, weight_decay=0.0, eps=1e-3)
    assert max(run_side_by_side(a, opt_a, b, opt_b, 10)) > 1e-3


def test_soap_drops_to_a_different_optimizer_with_each_older_convention():
    """Each older convention alone moves the trajectory away from the library's SOAP by far more than the
    tolerance above: the test above can fail."""
    for change in ({"first_step": "update"}, {"statistic_timing": "before"}, {"refresh": Eigh()},
                   {"eps_placement": "adam", "eps": 1e-3}):
        a, b = square_mlp(), square_mlp()
        opt_a = Symo(a.named_parameters(), symo.parse_spec(MUON_STYLE), preset="soap", lr=0.01,
                     precondition_frequency=3, stats_dtype="float64", **change)
        opt_b = pytorch_optimizer.SOAP(b.parameters(), lr=0.01, weight_decay=0.0, precondition_frequency=3,
                                       eps=change.get("eps", 1e-8))
        assert max(run_side_by_side(a, opt_a, b, opt_b, 12)) > 1e-3, change


def test_soap_muon_is_the_polar_factor_of_soaps_direction():
    """then_orthogonalize with the SOAP inner (two-sided, exact polar factor, no Nesterov) on a square weight: each
    update is lr polar(N), N the direction pytorch-optimizer's SOAP takes from the same gradients (its update at
    lr 1; the Frobenius rescale and SOAP's step size are positive scalars, which the polar factor does not see), to
    1e-4: the polar factor amplifies the rounding that Adam divides by eps on the first rotated steps."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    twin = torch.nn.Parameter(w.detach().clone())
    spec = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    opt = Symo({"w": w}, spec, preset="then_orthogonalize", inner="eigen_adam", two_sided=True,
               nesterov=False, backend="eigh", stats_dtype="float64", precondition_frequency=3, lr=0.05)
    lib = pytorch_optimizer.SOAP([twin], lr=1.0, weight_decay=0.0, precondition_frequency=3)
    assert_polar_of_the_librarys_direction(opt, lib, w, twin, torch.randn(5, 5, dtype=F64), lr=0.05, steps=12)


def test_eigenbasis_power_is_the_signed_root_in_the_librarys_eigenbasis():
    """eigenbasis_power=0.5, the SOAP authors' SOAP-Muon code: each update is lr Q_L [sign(o) |o|^0.5] Q_R^T
    rescaled to polar(N)'s norm, o = Q_L^T polar(N) Q_R, N pytorch-optimizer's SOAP direction and Q_L, Q_R that
    library's own eigenbases before its step (a basis column's sign or order does not change the result)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    twin = torch.nn.Parameter(w.detach().clone())
    target = torch.randn(5, 5, dtype=F64)
    spec = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    opt = Symo({"w": w}, spec, preset="then_orthogonalize", inner="eigen_adam", two_sided=True, eigenbasis_power=0.5,
               nesterov=False, backend="eigh", stats_dtype="float64", precondition_frequency=3, lr=0.05)
    lib = pytorch_optimizer.SOAP([twin], lr=1.0, weight_decay=0.0, precondition_frequency=3)
    moved_off_the_polar_factor = []
    for t in range(12):
        w.grad = None
        (((w - target) ** 3).sum() + (w @ w.T).square().sum()).backward()
        twin.grad = w.grad.clone()
        before, lib_before = w.detach().clone(), twin.detach().clone()
        bases = [q.clone() for q in lib.state[twin]["Q"]] if t > 0 else None
        opt.step()
        lib.step()
        if t == 0:
            continue
        o = polar(lib_before - twin.detach())
        coords = bases[0].T @ o @ bases[1]
        rooted = bases[0] @ (coords.sign() * coords.abs().sqrt()) @ bases[1].T
        expected = 0.05 * rooted * (o.norm() / rooted.norm())
        # the first rotated step: the basis is the first gradient's singular vectors, so o is nearly diagonal, and
        # the root's infinite slope at 0 lifts its off-diagonal rounding to 4e-4 (that update is 0.2% off polar(N))
        assert rel(before - w.detach(), expected) < (1e-3 if t == 1 else 1e-4), t
        if t > 1:
            moved_off_the_polar_factor.append(rel(before - w.detach(), 0.05 * o))
    assert min(moved_off_the_polar_factor) > 0.1  # the root changes the update: the check above can fail


def test_eigenbasis_power_is_refused_where_there_is_no_eigenbasis():
    spec = symo.parse_spec('[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n')
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match="eigenbasis_power acts in the eigenbases of inner='eigen_adam'"):
        Symo({"w": w}, spec, preset="then_orthogonalize", eigenbasis_power=0.5)
    with pytest.raises(ValueError, match=r"eigenbasis_power must be in \(0, 1\]"):
        Symo({"w": w}, spec, preset="soap_muon", eigenbasis_power=0.0)


def test_the_first_step_builds_the_statistics_and_moves_nothing():
    model = square_mlp()
    opt = Symo(model.named_parameters(), symo.parse_spec(MUON_STYLE), preset="soap", weight_decay=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    ((model(torch.randn(8, 6, dtype=F64)) ** 2).sum()).backward()
    opt.step()
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before))
    assert all(float(opt.state[p]["momentum_buffer"].abs().max()) == 0.0 for p in model.parameters())
    block = opt.block_statistics()["L0"]
    assert {"ema", "basis", "ema_width", "basis_width"} <= set(block) and "exp_avg_sq" not in block
    opt.step()
    assert not torch.equal(next(model.parameters()).detach(), before[0])


def test_power_qr_converges_to_the_eigenbasis_and_reports_the_order():
    """Repeated refreshes are orthogonal iteration: the columns converge to the eigenvectors by descending
    eigenvalue (an oracle: the dense eigh). The order is the sort of the previous columns' estimates."""
    torch.manual_seed(0)
    q0, _ = torch.linalg.qr(torch.randn(6, 6, dtype=F64))
    evals = torch.tensor([6.0, 5.0, 4.0, 3.0, 2.0, 1.0], dtype=F64)
    a = (q0 * evals) @ q0.T
    previous, _ = torch.linalg.qr(torch.randn(1, 6, 6, dtype=F64))
    q, order = power_qr_basis(a[None], previous)
    estimate = (previous * (a @ previous)).sum(dim=-2)
    assert torch.equal(order, torch.argsort(estimate, dim=-1, descending=True))
    for _ in range(200):
        q, _ = power_qr_basis(a[None], q)
    assert float(((q[0].T @ q0).abs() - torch.eye(6, dtype=F64)).abs().max()) < 1e-8
    assert float((power_qr_basis(a[None], previous, iterations=200)[0][0].T @ q0).abs().diagonal().min()) > 1 - 1e-8
    with pytest.raises(ValueError, match="PowerQR.iterations must be an int >= 1"):
        PowerQR(iterations=0)


# a Muon-style spec (one private row space) and a gpt_true-like one (three heads, each its own O(4) basis)
ROW_SPECS = {"muon_style": '[spaces]\nr = "signed_perm"\n[params]\nweight = ["r", "_"]\n',
             "per_head": '[spaces]\nhead = { group = "identity", size = 3 }\n'
                         'd = { group = "orthogonal", per = "head" }\n[params]\nweight = ["(head d)", "_"]\n'}


@pytest.mark.parametrize("spec", sorted(ROW_SPECS))
@pytest.mark.parametrize("preset", ["soap", "soap_heavyball", "soap_muon", "soap_muon_signed_root"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_soap_never_makes_a_nan_on_rank_deficient_ill_conditioned_gradients(dtype, preset, spec):
    """A wide layer (statistics of rank 2 of 12), gradients spanning 1e-6..1e3, a gpt_true-like per-head spec and a
    Muon-style one: 25 steps in the user's dtype stay finite."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(12, 12, bias=False).to(dtype)
    options = {"eigenbasis_power": 0.5} if preset == "soap_muon_signed_root" else {}
    opt = Symo(layer.named_parameters(), symo.parse_spec(ROW_SPECS[spec]), preset=preset.removesuffix("_signed_root"),
               precondition_frequency=2, **options)
    start = layer.weight.detach().clone()
    for t in range(25):
        u, v = torch.randn(12, 2), torch.randn(2, 12)
        layer.weight.grad = ((u * torch.tensor([1e3, 1e-6])) @ v * (10.0 ** (t % 5 - 2))).to(dtype)
        opt.step()
        assert bool(torch.isfinite(layer.weight).all()), t
    assert float((layer.weight - start).float().norm()) > 0.01  # it moved: finite, not frozen


def test_the_conventions_benchmark_writes_its_table(tmp_path):
    from benchmarks import soap_conventions

    assert soap_conventions.main(["--quick", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "soap_conventions.json").read_text())
    assert set(data["arms"]) == {"soap (float32 statistics)", "soap, float64 statistics"}
    assert all(math.isfinite(a["test"]) for a in data["arms"].values())
    assert "| soap, float64 statistics |" in (tmp_path / "soap_conventions.md").read_text()


@pytest.mark.parametrize("preset", ["soap", "soap_heavyball", "soap_muon"])
def test_an_interrupted_soap_run_resumes_bit_identically(preset):
    """Stopped after 7 steps (a refresh and the skipped first step behind it), saved, loaded into a new optimizer
    and model: the next 5 steps equal those of the run that never stopped."""
    torch.manual_seed(3)
    x, y = torch.randn(32, 6, dtype=F64), torch.randn(32, 6, dtype=F64)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    spec = symo.parse_spec(MUON_STYLE)
    whole = square_mlp()
    opt = Symo(whole.named_parameters(), spec, preset=preset, precondition_frequency=3, stats_dtype="float64")
    steps(whole, opt, 7)
    saved_model, saved_opt = copy.deepcopy(whole.state_dict()), copy.deepcopy(opt.state_dict())
    steps(whole, opt, 5)
    resumed = square_mlp()
    resumed.load_state_dict(saved_model)
    again = Symo(resumed.named_parameters(), spec, preset=preset, precondition_frequency=3, stats_dtype="float64")
    again.load_state_dict(saved_opt)
    steps(resumed, again, 5)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters()))
