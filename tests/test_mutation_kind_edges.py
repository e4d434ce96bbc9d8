"""Every kind's edges, a third seeded sample of mutation testing of symo/optim/kinds/ (the first two are in
tests/test_mutation_kinds.py): the size caps and their boundaries, float32 weights, forced refreshes, stacked
blocks and heads as batch elements, each against an independent oracle (a dense float64 power, a closed form,
the step on each block or head alone, or the documented message).
"""

from __future__ import annotations

import pytest
import torch
from helpers import ROWS, loss_grad, rel, singular_values_of_updates

import symo
from symo.optim import Symo
from symo.optim.kinds.eigen_adam import EigenAdamConfig

F64 = torch.float64


# ------------------------------------------------------------------ a third seeded sample: every kind's edges
def spaces_spec(shapes: dict[str, tuple[int, ...]], group: str = "signed_perm") -> str:
    """One space per parameter, on its rows: each parameter is its own block (mult = its columns, width = its
    rows, d = its rows; Y = G^T)."""
    spaces = "".join(f'{n}_rows = "{group}"\n' for n in shapes)
    params = "".join(f'{n} = ["{n}_rows", "_"]\n' for n in shapes)
    return f"[spaces]\n{spaces}[params]\n{params}"


def one_step(shapes: dict[str, tuple[int, ...]], seed: int = 0, dtype: torch.dtype = F64, steps: int = 1,
             **options) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor], Symo]:
    """Weights, gradients (the same every step) and the change of every weight after `steps` steps (momentum off,
    weight decay 0, lr 1) of an optimizer on `shapes`, one block per parameter."""
    torch.manual_seed(seed)
    params = {n: torch.nn.Parameter(torch.randn(*s, dtype=dtype)) for n, s in shapes.items()}
    grads = {n: torch.randn(*s, dtype=dtype) for n, s in shapes.items()}
    start = {n: p.detach().clone() for n, p in params.items()}
    opt = Symo(params, symo.parse_spec(spaces_spec(shapes)), lr=1.0, beta1=0.0, nesterov=False, weight_decay=0.0,
               **options)
    for _ in range(steps):
        for n, p in params.items():
            p.grad = grads[n].clone()
        opt.step()
    return start, grads, {n: p.detach() - start[n] for n, p in params.items()}, opt


def dense_power(a: torch.Tensor, p: float) -> torch.Tensor:
    evals, evecs = torch.linalg.eigh(a)
    return (evecs * evals.pow(p)) @ evecs.T


# ---------------- base: diagonal_power, update_scale_factor, AdamOptions' eps
@pytest.mark.parametrize("absolute", [False, True])
def test_diagonal_power_is_the_entrywise_damped_power_per_batch_element(absolute):
    """diagonal_power on (batch 2, mult 3, 1): each element's damping is relative to its own largest entry (or
    absolute), an exact zero maps to 0; a closed form entry by entry."""
    from symo.optim.kinds.base import diagonal_power

    diag = torch.tensor([[[4.0], [1.0], [0.0]], [[0.5], [2.0], [0.25]]], dtype=F64)
    got = diagonal_power(diag, power=-0.5, damping=0.1, absolute=absolute)
    want = torch.zeros(2, 3, 1, dtype=F64)
    for i in range(2):
        top = float(diag[i].max())
        for j in range(3):
            x = float(diag[i, j, 0])
            want[i, j, 0] = 0.0 if x == 0 else (x + (0.1 if absolute else 0.1 * top)) ** -0.5
    assert got.shape == (2, 3, 1)
    assert float((got - want).abs().max()) < 1e-14


def test_update_scale_factor_divides_out_the_natural_scale_under_muon_and_adamw():
    """The documented factors: natural 1; muon and adamw d^power (dividing out the natural d^-power), muon's first
    stage times sqrt(max(1, width / mult))."""
    from types import SimpleNamespace

    from symo.optim.kinds.base import update_scale_factor

    plan = SimpleNamespace(dim=9, mult=2, width=8)
    assert update_scale_factor(plan, "natural", -0.5, True) == 1.0
    assert update_scale_factor(plan, "adamw", -0.5, True) == pytest.approx(1 / 3, rel=1e-15)
    assert update_scale_factor(plan, "adamw", -0.25, False) == pytest.approx(9 ** -0.25, rel=1e-15)
    assert update_scale_factor(plan, "muon", -0.5, True) == pytest.approx(2 / 3, rel=1e-15)
    assert update_scale_factor(plan, "muon", -0.5, False) == pytest.approx(1 / 3, rel=1e-15)


def test_adam_eps_takes_zero_and_refuses_a_non_finite_value_with_its_message():
    assert EigenAdamConfig(eps=0.0).eps == 0.0
    for bad in (float("inf"), float("nan"), -1e-8):
        with pytest.raises(ValueError) as err:
            EigenAdamConfig(eps=bad)
        assert str(err.value) == f"eps must be a finite number >= 0, got {bad}"


# ---------------- root: the size cap, its boundary, and the blocks after a diagonal one
def test_root_takes_the_diagonal_above_the_cap_and_the_full_matrix_at_it():
    """max_precond_dim=2: a block of multiplicity 4 (> 2) applies (diag A + damping max diag A)^power entrywise,
    the next block, of multiplicity 2 (= the cap, `mult > cap` is the rule), the full (A + damping lambda_max I)^power
    (a dense float64 eigh); the statistic A = Y Y^T / d of this step (beta2 = 0), Y = G^T."""
    shapes = {"a": (6, 4), "b": (6, 2)}
    _, grads, moved, opt = one_step(shapes, preconditioner="root", beta2=0.0, damping=1e-3, power=-0.4,
                                    max_precond_dim=2, update_scale="natural", stats_dtype="float64")
    y = grads["a"].T
    diag = (y * y).sum(dim=1, keepdim=True) / 6
    assert rel(-moved["a"].T, (diag + 1e-3 * diag.max()) ** -0.4 * y) < 1e-12
    y = grads["b"].T
    a = y @ y.T / 6
    want = dense_power(a + 1e-3 * torch.linalg.eigvalsh(a).max() * torch.eye(2, dtype=F64), -0.4) @ y
    assert rel(-moved["b"].T, want) < 1e-12
    stats = opt.block_statistics()
    assert stats["L0"]["precond"].shape == (1, 4, 1) and stats["L1"]["precond"].shape == (1, 2, 2)


def test_a_non_finite_root_power_names_the_blocks_it_was_batched_over(monkeypatch):
    """NonFiniteUpdateError names the block and the method: two same-size blocks evaluated in one batched call are
    named as "2 blocks (the first's name, ...)"."""
    import symo.optim.matrix_functions as optim
    from symo import NonFiniteUpdateError

    real = optim.sym_power
    monkeypatch.setattr(optim, "sym_power", lambda a, *args, **kwargs: real(a, *args, **kwargs) * float("nan"))
    with pytest.raises(NonFiniteUpdateError) as err:
        one_step({"a": (5, 3), "b": (5, 3)}, preconditioner="root", backend="eigh")
    assert str(err.value).startswith("Symo's curvature power for 2 blocks (block L0 (nat(a_rows)), ...) came out "
                                     "NaN/inf (backend eigh, statistic dtype torch.float64, statistic finite)")


# ---------------- taylor: the size cap, the trivial block, float32 weights, a forced refresh
def taylor_reference(w: torch.Tensor, g: torch.Tensor, power: float, damping: float) -> torch.Tensor:
    """H^{2 power} with H = (S_w + max(damping, 1e-8) lambda_max(S_w) I)^{-1} # S_g (the geometric mean
    A # B = A^{1/2} (A^{-1/2} B A^{-1/2})^{1/2} A^{1/2}), damped by damping lambda_max(H), in block coordinates
    (X = W^T, Y = G^T, d = rows), dense float64."""
    x, y, d = w.T.double(), g.T.double(), w.shape[0]
    sw, sg = x @ x.T / d, y @ y.T / d
    sw = sw + max(damping, 1e-8) * torch.linalg.eigvalsh(sw).max() * torch.eye(len(sw), dtype=F64)
    a = dense_power(sw, -1.0)
    half, inv_half = dense_power(a, 0.5), dense_power(a, -0.5)
    h = half @ dense_power(inv_half @ sg @ inv_half, 0.5) @ half
    h = (h + h.T) / 2
    return dense_power(h + damping * torch.linalg.eigvalsh(h).max() * torch.eye(len(h), dtype=F64), 2 * power)


@pytest.mark.parametrize("absolute", [False, True])
def test_taylor_takes_the_diagonal_of_s_g_above_the_cap_and_the_geometric_mean_at_it(absolute):
    """max_precond_dim=3: multiplicity 4 (> 3) keeps diag(S_g)^power, damped by `damping` relative to its largest
    entry (or absolutely); multiplicity 3 (= the cap) the taylor estimator H^{2 power} (a dense float64 reference)."""
    shapes = {"a": (6, 4), "b": (6, 3)}
    start, grads, moved, opt = one_step(shapes, preconditioner="taylor", power=-0.4, damping=1e-3,
                                        damping_mode="absolute" if absolute else "relative", max_precond_dim=3,
                                        update_scale="natural", stats_dtype="float64")
    y = grads["a"].T
    diag = (y * y).sum(dim=1, keepdim=True) / 6
    assert rel(-moved["a"].T, (diag + (1e-3 if absolute else 1e-3 * diag.max())) ** -0.4 * y) < 1e-12
    stats = opt.block_statistics()
    assert stats["L0"]["precond"].shape == (1, 4, 1)
    if not absolute:  # the reference damps relatively
        want = taylor_reference(start["b"], grads["b"], -0.4, 1e-3)
        assert rel(stats["L1"]["precond"][0], want) < 1e-9
        assert rel(-moved["b"].T, want @ grads["b"].T) < 1e-9


def test_taylor_forms_s_w_of_float32_weights_in_the_statistics_dtype():
    """float32 weights, float64 statistics: the stored H^{2 power} is the dense float64 reference of the same
    (float32) weights and gradients to float64 precision, not to float32's."""
    start, grads, _, opt = one_step({"w": (6, 3)}, dtype=torch.float32, preconditioner="taylor", power=-0.5,
                                    damping=1e-3, stats_dtype="float64")
    precond = opt.block_statistics()["L0"]["precond"][0]
    assert precond.dtype == F64
    assert rel(precond, taylor_reference(start["w"], grads["w"], -0.5, 1e-3)) < 1e-10


def test_taylor_names_a_trivial_block_whose_power_came_out_non_finite(monkeypatch):
    """The trivial block (a perm group's invariant direction) takes S_g^power by eigh: a non-finite result raises
    NonFiniteUpdateError naming that block and the eigh backend."""
    import symo.optim.matrix_functions as optim
    from symo import NonFiniteUpdateError

    real = optim.sym_power
    monkeypatch.setattr(optim, "sym_power", lambda a, *args, **kwargs: real(a, *args, **kwargs) * float("nan"))
    w = torch.nn.Parameter(torch.randn(5, 3, dtype=F64))
    opt = Symo({"w": w}, symo.parse_spec('[spaces]\np = "perm"\n[params]\nw = ["p", "_"]\n'), preconditioner="taylor")
    w.grad = torch.randn(5, 3, dtype=F64)
    with pytest.raises(NonFiniteUpdateError) as err:
        opt.step()
    assert str(err.value).startswith("Symo's curvature power for block L1 (trivial) came out NaN/inf (backend eigh,")


def test_a_taylor_power_changed_mid_run_refreshes_once_then_keeps_the_schedule():
    """precondition_frequency=10: the power changed after step 3 is taken at step 4, and H (which depends on the
    moving weights) then stays as it is until the scheduled refresh."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    target = torch.randn(6, 4, dtype=F64)
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preconditioner="taylor", lr=0.05, precondition_frequency=10)
    precs = []
    for t in range(1, 8):
        if t == 4:
            opt.config.power = -0.4
        loss_grad(w, target)
        opt.step()
        precs.append(opt.block_statistics()["L0"]["precond"].clone())
    assert torch.equal(precs[1], precs[0]) and not torch.equal(precs[3], precs[2])
    for t in (4, 5, 6):
        assert torch.equal(precs[t], precs[3]), t + 1


# ---------------- polar: the gradient statistic's iteration settings, stacked blocks
def test_polar_passes_ns_inverse_steps_to_the_gradient_statistics_iteration():
    """statistic="gradient" on a newton_schulz block: S^{-1/2} comes from the coupled iteration with
    `ns_inverse_steps` steps where that many steps are accurate at the damping, from eigh otherwise. Three steps
    are not accurate at relative damping 0.1, so the update is the exact (A + 0.1 lambda_max I)^{-1/2} Y (dense
    float64 eigh), which the default step count's iteration is not."""
    from symo.runtime.linalg import ns_inverse_root_is_accurate

    for steps, exact in ((3, True), (None, False)):
        extra = {} if steps is None else {"ns_inverse_steps": steps}
        _, grads, moved, _ = one_step({"w": (6, 4)}, preconditioner="polar", statistic="gradient",
                                      backend="newton_schulz", update_scale="natural", damping=0.1, **extra)
        y = grads["w"].T
        a = y @ y.T / 6
        assert ns_inverse_root_is_accurate(a[None], steps or 25, 0.1, False) is not exact
        want = dense_power(a + 0.1 * torch.linalg.eigvalsh(a).max() * torch.eye(4, dtype=F64), -0.5) @ y
        assert (rel(-moved["w"].T, want) < 1e-12) is exact, steps


@pytest.mark.parametrize("batch_blocks", [False, True, "auto"])
def test_polar_blocks_stacked_or_not_each_take_sqrt_d_times_their_polar_factor(batch_blocks, monkeypatch):
    """Three blocks, two of one shape: each update is sqrt(d) U V^T of its own Y = G^T (the SVD's polar factor),
    whether same-shape blocks are stacked (batch_blocks=True: one matrix-function call for the pair, one for the
    odd block) or not (False, and 'auto' on CPU: one call per block)."""
    import symo.optim.kinds.polar as polar

    real, calls = polar.current_statistic_apply, []

    def counted(y, **kwargs):
        calls.append(y.shape[0])
        return real(y, **kwargs)

    monkeypatch.setattr(polar, "current_statistic_apply", counted)
    _, grads, moved, _ = one_step({"a": (6, 4), "b": (6, 2), "c": (6, 4)}, preconditioner="polar", backend="eigh",
                                  damping=0.0, update_scale="natural", batch_blocks=batch_blocks)
    for name, g in grads.items():
        u, _, vh = torch.linalg.svd(g.T, full_matrices=False)
        assert rel(-moved[name].T, 6 ** 0.5 * u @ vh) < 1e-12, name
    assert sorted(calls) == ([1, 2] if batch_blocks is True else [1, 1, 1])


# ---------------- published: the size cap, its boundary, the low-rank half power
def published_reference(ws: dict[str, torch.Tensor], gs: dict[str, torch.Tensor], cap: int, scope: str,
                        d: float = 1e-4) -> dict[str, torch.Tensor]:
    """The published step's first update (beta1 = 0: m = g, m_hat = g / (1 - 1e-4); S_g_hat = m_hat m_hat^T / dim)
    per block in block coordinates (Y = G^T, X = W^T, dim = rows), dense float64: H_inv = h P(h S_g h, -1/2) h,
    h = P(S_w, 1/2); a block above the cap keeps the diagonals (every power entrywise). s_max: each matrix's
    largest |eigenvalue|, over all blocks for scope 'all'."""
    def p(evals, evecs, q, s):
        f = (evals.abs() + d * s).pow(q)
        return f if evecs is None else (evecs * f) @ evecs.T

    def eig(m, diag):
        return (m, None) if diag else torch.linalg.eigh(m)

    diag = {n: w.shape[1] > cap for n, w in ws.items()}
    sw, sg = {}, {}
    for n, w in ws.items():
        x, y = w.T.double(), gs[n].T.double() / (1 - 1e-4)
        full_w, full_g = x @ x.T / w.shape[0], y @ y.T / w.shape[0]
        sw[n] = torch.diagonal(full_w)[:, None] if diag[n] else full_w
        sg[n] = torch.diagonal(full_g)[:, None] if diag[n] else full_g

    def s_max(eigs):
        own = {n: float(e.abs().max()) for n, (e, _) in eigs.items()}
        return own if scope == "block" else dict.fromkeys(own, max(own.values()))

    w_eigs = {n: eig(sw[n], diag[n]) for n in ws}
    w_max = s_max(w_eigs)
    h = {n: p(*w_eigs[n], 0.5, w_max[n]) for n in ws}
    inner = {n: h[n] * sg[n] * h[n] if diag[n] else h[n] @ sg[n] @ h[n] for n in ws}
    i_eigs = {n: eig(inner[n], diag[n]) for n in ws}
    i_max = s_max(i_eigs)
    out = {}
    for n in ws:
        mid = p(*i_eigs[n], -0.5, i_max[n])
        out[n] = h[n] * mid * h[n] if diag[n] else h[n] @ mid @ h[n]
    return out


@pytest.mark.parametrize("scope", ["all", "block"])
def test_published_takes_the_diagonals_above_the_cap_and_the_full_step_at_it(scope):
    """max_precond_dim=6: a 6 x 7 weight (multiplicity 7 > 6) keeps the diagonals of S_g and S_w, a 2 x 6 weight
    (multiplicity 6 = the cap, width 2: S_w's half power through the 2 x 2 Gram, applied as a low-rank sum) and a
    6 x 3 weight take the full step; the first update against the dense float64 reference."""
    shapes = {"a": (6, 7), "b": (2, 6), "c": (6, 3)}
    start, grads, moved, opt = one_step(shapes, preset="published", damping_scope=scope, max_precond_dim=6)
    want = published_reference(start, grads, 6, scope)
    for name, h_inv in want.items():
        y = grads[name].T
        assert rel(-moved[name].T, h_inv * y if shapes[name][1] > 6 else h_inv @ y) < 1e-9, name
    stats = opt.block_statistics()
    assert stats["L0"]["precond"].shape == (1, 7, 1) and stats["L1"]["precond"].shape == (1, 6, 6)


def test_published_damped_power_of_a_full_matrix_is_its_documented_spectral_function():
    """damped_power with eigenvectors: U diag((damping s_max + |lambda|)^p) U^T, a zero to a negative power 0."""
    from symo.optim.kinds.published import damped_power

    torch.manual_seed(4)
    q, _ = torch.linalg.qr(torch.randn(2, 4, 4, dtype=F64))
    evals = torch.tensor([[3.0, -1.0, 0.5, 2.0], [1.0, 0.25, -4.0, 0.0]], dtype=F64)
    s_max = torch.tensor([[3.0], [4.0]], dtype=F64)
    for p, damping in ((0.5, 1e-2), (-0.5, 1e-2), (-0.5, 0.0)):
        got = damped_power(evals, q, p, damping, s_max)
        s = evals.abs() + damping * s_max
        f = torch.where(s > 0, s.pow(p), torch.zeros_like(s))
        want = torch.stack([q[i] @ torch.diag(f[i]) @ q[i].T for i in range(2)])
        assert float((got - want).abs().max()) < 1e-12, (p, damping)


# ---------------- eigen_adam: the momentum statistic, adamw's RMS, a running-sum statistic
def test_eigen_adams_momentum_statistic_without_momentum_is_its_gradient_statistic():
    """beta1 = 0 (no Nesterov): the momentum is the gradient, so statistic="momentum" (statistic and second moment
    from u) and statistic="gradient" (from the raw gradient) must take the same steps."""
    torch.manual_seed(0)
    runs = []
    for statistic in ("momentum", "gradient"):
        w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64, generator=torch.Generator().manual_seed(1)))
        opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="eigen_adam", statistic=statistic, beta1=0.0,
                   nesterov=False, lr=0.01, precondition_frequency=2)
        gen = torch.Generator().manual_seed(2)
        for _ in range(6):
            w.grad = torch.randn(6, 4, dtype=F64, generator=gen)
            opt.step()
        runs.append(w.detach().clone())
    assert rel(runs[0], runs[1]) < 1e-12


def test_eigen_adam_adamw_update_scale_matches_the_update_rms_to_adamw_rms():
    """update_scale='adamw': every update after the first (which only builds the statistics) has RMS
    lr * adamw_rms over the weight's entries."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    target = torch.randn(6, 4, dtype=F64)
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="eigen_adam", lr=0.1, update_scale="adamw", adamw_rms=0.3,
               weight_decay=0.0)
    for t in range(4):
        loss_grad(w, target)
        before = w.detach().clone()
        opt.step()
        rms = float((before - w.detach()).square().mean().sqrt())
        assert (rms == 0.0) if t == 0 else abs(rms / (0.1 * 0.3) - 1) < 1e-10, (t, rms)


@pytest.mark.parametrize("beta2", [1.0, 0.0, 0.5])
def test_eigen_adams_statistic_is_a_running_sum_at_beta2_one(beta2):
    """The basis statistic L (not bias-corrected) after three steps, Y = G^T: the plain running sum of Y Y^T at
    beta2 = 1, the last step's Y Y^T at beta2 = 0, the EMA (1 - beta2) sum beta2^(t-1-s) Y_s Y_s^T otherwise."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    opt = Symo({"w": w}, symo.parse_spec(ROWS), preset="eigen_adam", beta2=beta2, lr=0.01,
               stats_dtype="float64")
    want = torch.zeros(4, 4, dtype=F64)
    for _ in range(3):
        w.grad = torch.randn(6, 4, dtype=F64)
        opt.step()
        stat = w.grad.T @ w.grad
        want = want + stat if beta2 == 1.0 else beta2 * want + (1 - beta2) * stat
    assert rel(opt.block_statistics()["L0"]["ema"][0], want) < 1e-12


# ---------------- then_orthogonalize: heads as batch elements, the Newton-Schulz scale
def test_then_orthogonalize_on_heads_is_the_step_on_each_head_alone():
    """Three heads of an identity owner are one block of batch 3; each head's update must be the one a separate
    parameter (its own block) gets from the same gradients: the renormalisation to the momentum's norm is per
    head. Head 0's gradient is 1e-7 of the others', where Newton-Schulz's eps (1e-7) makes the scale count."""
    spec = symo.parse_spec('[spaces]\nhead = { group = "identity", size = 3 }\nd = { group = "orthogonal", '
                           'per = "head" }\n[params]\n"w" = ["(head d)", "_"]\n')
    alone = symo.parse_spec("[spaces]\n" + "".join(f'd{i} = "orthogonal"\n' for i in range(3)) + "[params]\n"
                            + "".join(f'h{i} = ["d{i}", "_"]\n' for i in range(3)))
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4, dtype=F64))
    heads = {f"h{i}": torch.nn.Parameter(w.detach()[2 * i:2 * i + 2].clone()) for i in range(3)}
    options = dict(preset="then_orthogonalize", lr=0.1, backend="newton_schulz", ns_method="iterate")
    opt, opt_alone = Symo({"w": w}, spec, **options), Symo(heads, alone, **options)
    assert opt.plan[0].blocks["L0"].batch == 3
    for _ in range(3):
        g = torch.randn(6, 4, dtype=F64)
        g[:2] *= 1e-7
        w.grad = g.clone()
        for i in range(3):
            heads[f"h{i}"].grad = g[2 * i:2 * i + 2].clone()
        opt.step()
        opt_alone.step()
        assert rel(w.detach(), torch.cat([heads[f"h{i}"].detach() for i in range(3)])) < 1e-12


def test_newton_schulz_polar_factor_keeps_muons_scale():
    """backend='newton_schulz' with Muon's update scale: the update over lr is Muon's quintic of the normalised P,
    whose singular values lie in roughly [0.7, 1.2] (linalg.newton_schulz) -- not scaled by sqrt(d) twice."""
    values, backend = singular_values_of_updates(backend="newton_schulz")
    assert backend.startswith("newton_schulz")
    for s in values:
        assert 0.3 < float(s.min()) and float(s.max()) < 1.3, s
