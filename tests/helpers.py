"""Checks and small references shared by the test modules (a helper, not a test module: the tests
import from here, never from one another).

- `rel`, `max_rel`: error measures, in float64;
- `polar`, `ref_power`: dense float64 references of the polar factor and of the matrix power rule;
- `oracle_S`: the orbit average of tests/oracles.py (exhaustive enumeration, or tests/oracles_haar.py's exact moments
  where an orthogonal space repeats within a parameter);
- `assignment`, `assert_covers`, `assert_all_true`, `independent_check`: checks of inferred specs;
- `inverse_element`: g^-1 space by space, heads permuted as wholes included;
- `ROWS`, `COLS`, `loss_grad`, `singular_values_of_updates`: the kinds' edge tests' one-matrix problem
  (tests/test_mutation_kinds.py, test_mutation_kind_edges.py);
- `muons_first_step_on_gpt`: Muon's first step on a small GPT under a bundled spec (tests/test_spec_gpt_muon_qkv*.py);
- `newton_schulz_modules`, `keep_newton_schulz`: the modules whose Newton-Schulz a pytorch-optimizer Muon variant
  calls, and their iteration restored after a test that patches it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import oracles as O
import oracles_dense as OD
import oracles_haar
import torch
from symo.compiler import bind, shapes_of
from torch.func import functional_call

import symo

F64 = torch.float64
EPS64 = torch.finfo(F64).eps


# ---------------------------------------------------------------- errors and dense references

def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (a zero b gives ||a|| / 1e-300)."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|."""
    return float((a - b).abs().max() / b.abs().max())


def polar(g: torch.Tensor, rank: int | None = None, tol: float | None = None) -> torch.Tensor:
    """U V^T from the float64 thin SVD of g: every singular direction, the top `rank`, or those above
    `tol` times the largest singular value."""
    u, s, vh = torch.linalg.svd(g.double(), full_matrices=False)
    keep = s > tol * s.max() if tol is not None else torch.arange(len(s)) < (rank or len(s))
    return u[:, keep] @ vh[keep]


def ref_power(a: torch.Tensor, p: float, damping: float = 0.0, absolute: bool = False,
              zero_rel: float | None = None) -> torch.Tensor:
    """Per block, by float64 eigh: (x + shift)^p on the eigenvalues above zero_rel lambda_max, 0 on the rest (exact
    zeros, under both dampings), with shift = damping lambda_max (relative) or damping (absolute). zero_rel is by
    default the README's 8 sqrt(m) eps: a real eigenvalue just above it is kept and damped, so the reference
    draws the line where the documented contract does. The one PSD-power reference of the tests."""
    out = []
    for block in a.reshape(-1, *a.shape[-2:]).to(F64):
        evals, evecs = torch.linalg.eigh((block + block.T) / 2)
        lam = max(float(evals.max()), 0.0)
        shift = damping if absolute else damping * lam
        tol = (8 * math.sqrt(len(evals)) * EPS64 if zero_rel is None else zero_rel) * lam
        f = torch.tensor([(x + shift) ** p if x > tol else 0.0 for x in evals.tolist()], dtype=torch.float64)
        out.append((evecs * f) @ evecs.T)
    return torch.stack(out).reshape(a.shape)


# ---------------------------------------------------------------- the orbit average of the oracle

def oracle_S(spaces: dict[str, tuple], layout: Sequence, v: torch.Tensor,
             actions: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """E_g[A_g v v^T A_g^T] as a dense float64 matrix (tests/oracles.py). `spaces` and `layout` are the
    oracle's ({space: (group, n, owner)}, [(param, shape, axes)]); `actions`, every A_g, if the caller
    keeps them. An orthogonal space "h" that repeats within a parameter takes Haar's exact moments
    (oracles_haar.haar_orbit_average): B_n's fourth moment differs from Haar's once a space repeats."""
    group, n, _ = spaces.get("h", (None, None, None))
    if group == "orthogonal" and any(list(axes).count("h") > 1 for _, _, axes in layout):
        assert len(spaces) == 1, "Haar's moments are implemented for one repeated space named h"
        return oracles_haar.haar_orbit_average(n, layout, v)
    return OD.dense_orbit_average(actions if actions is not None else O.action_matrices(spaces, layout), v)


# ---------------------------------------------------------------- inferred specs

def assignment(spec, model, sizes=None) -> tuple[dict[tuple, str], object]:
    """(param, block, atom) -> space name, for every atom a non-identity group acts on; and the bound spec."""
    bound = bind(spec, shapes_of(model), sizes)
    out = {}
    for p in bound.params:
        for b in p.blocks:
            for k, a in enumerate(b.atoms):
                if a.space is not None:
                    out[(p.name, b.slices, k)] = a.space
    return out, bound


def assert_covers(hand, inferred, model, hand_sizes=None, same_group=None):
    """Every atom the hand spec moves, the inferred spec moves too, with one inferred space per hand space
    (a renaming), and for the hand spaces in `same_group` the inferred group is the hand one."""
    h, hb = assignment(hand, model, hand_sizes)
    i, ib = assignment(inferred, model)
    rename = {}
    for key, space in h.items():
        assert key in i, f"inferred spec leaves {key} free; the hand spec moves it with {space}"
        rename.setdefault(space, set()).add(i[key])
    for space, targets in rename.items():
        assert len(targets) == 1, f"hand space {space} is split into {targets}"
    assert len({next(iter(t)) for t in rename.values()}) == len(rename), "two hand spaces merged into one"
    for space in same_group or ():
        (target,) = rename[space]
        assert ib.spaces[target].group == hb.spaces[space].group, (space, target)
        assert (ib.spaces[target].per is None) == (hb.spaces[space].per is None)
    return rename, ib


def assert_all_true(result):
    assert result.spaces, "nothing inferred"
    for s in result.spaces:
        assert s.status in ("true", "identity"), s
    assert result.joint_rel_change is not None and result.joint_rel_change <= result.tolerance
    assert result.tolerance <= 1e-9 or any("lower precision" in n for n in result.notes)


def independent_check(model, spec, inputs):
    """symo.check_symmetry on the summed squared outputs in float64, through CompiledSpec.act (dense matrices)."""
    compiled = symo.compile(spec, model, disk_cache=False)
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    buffers = {n: b.detach().clone().double() if b.is_floating_point() else b for n, b in model.named_buffers()}

    def loss(w):
        out = functional_call(model, {**w, **buffers}, inputs)
        out = out[0] if isinstance(out, tuple) else out
        out = out.logits if hasattr(out, "logits") else out
        return (out.double() ** 2).sum()

    return symo.check_symmetry(loss, compiled, params, trials=2)


def inverse_element(compiled, g: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """g^-1 as CompiledSpec.act's element matrices. A space inverts by its transpose, except a per-space whose owner
    moves (heads permuted as wholes, docs/specs.md Example 4): g puts head pi(i) in slot i rotated by R_i, so slot j
    of g^-1 takes head sigma(j) = pi^-1(j) back with R_sigma(j)^T, not R_j^T."""
    out = {s: m.transpose(-1, -2) for s, m in g.items()}
    for s, info in compiled.spaces.items():
        owner = info["per"]
        if s in g and owner in g:
            out[s] = torch.einsum("jk,kba->jab", out[owner][0].abs(), g[s])
    return out


def assert_polar_of_the_librarys_direction(opt, lib, w, twin, target: torch.Tensor, lr: float, steps: int) -> None:
    """Symo's `opt` on `w` and a library optimizer `lib` (at lr 1) on `twin` get the same gradients of a fixed
    non-quadratic loss at w: the first step moves neither, and every later update of w is lr polar(N), N the
    library's update (its own weights do not enter its direction). To 1e-4: the polar factor amplifies the
    rounding that Adam divides by eps on the first rotated steps."""
    for t in range(steps):
        w.grad = None
        (((w - target) ** 3).sum() + (w @ w.T).square().sum()).backward()
        twin.grad = w.grad.clone()
        before, lib_before = w.detach().clone(), twin.detach().clone()
        opt.step()
        lib.step()
        if t == 0:
            assert torch.equal(before, w.detach()) and torch.equal(lib_before, twin.detach())
            continue
        assert rel(before - w.detach(), lr * polar(lib_before - twin.detach())) < 1e-4, t


# ------------------------------------------------------------------ the kinds' edge tests
ROWS = '[spaces]\nr = "signed_perm"\n[params]\nw = ["r", "_"]\n'
COLS = '[spaces]\nc = "signed_perm"\n[params]\nw = ["_", "c"]\n'


def loss_grad(w: torch.Tensor, target: torch.Tensor) -> None:
    w.grad = None
    (((w - target) ** 3).sum() + (w @ w.T).square().sum()).backward()


def singular_values_of_updates(**options) -> tuple[list[torch.Tensor], str]:
    """Four updates' singular values (over lr) of then_orthogonalize on a 5 x 5 weight, and the block's backend as
    `describe()` reports it."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5, 5, dtype=F64))
    target = torch.randn(5, 5, dtype=F64)
    opt = symo.Symo({"w": w}, symo.parse_spec(ROWS), preset="then_orthogonalize", lr=0.1, stats_dtype="float64",
               **options)
    out = []
    for _ in range(4):
        loss_grad(w, target)
        before = w.detach().clone()
        opt.step()
        out.append(torch.linalg.svdvals((before - w.detach()) / 0.1))
    (backend,) = re.findall(r", backend=([^;]+);", opt.describe())
    return out, backend


def assert_update_is_muons_polar(model: torch.nn.Module, grads: dict[str, torch.Tensor],
                                 before: dict[str, torch.Tensor], tol: float) -> None:
    """Each parameter moved (lr 1) by sqrt(max(1, rows / cols)) U V^T of its first gradient: Muon's scaled polar
    factor."""
    for n, g in grads.items():
        u, _, vh = torch.linalg.svd(g, full_matrices=False)
        upd = before[n] - model.get_parameter(n).detach()
        assert rel(upd, max(1.0, g.shape[0] / g.shape[1]) ** 0.5 * u @ vh) < tol, n


def muons_first_step_on_gpt(spec: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Muon's first step (lr 1, momentum and damping off, exact polar factor) under `spec` on a 2-layer float64 GPT
    of width 8: (the hidden matrices' gradients, how far each moved)."""
    from symo.train.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8)).double()
    opt = symo.Symo(model.named_parameters(), spec, lr=1.0, beta1=0.0, damping=0.0, backend="eigh",
                    update_scale="muon")
    idx = torch.randint(0, 11, (3, 8))
    model(idx, idx)[1].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.ndim == 2 and "transformer.h." in n}
    before = {n: model.get_parameter(n).detach().clone() for n in grads}
    opt.step()
    return grads, {n: before[n] - model.get_parameter(n).detach() for n in grads}


def newton_schulz_modules(cls: type) -> list:
    """The modules of `cls` and its bases that hold pytorch-optimizer's `zero_power_via_newton_schulz_5`."""
    import sys

    return [m for m in {sys.modules[c.__module__] for c in cls.__mro__}
            if hasattr(m, "zero_power_via_newton_schulz_5")]


def keep_newton_schulz(monkeypatch, cls: type) -> None:
    """Put each module's iteration back after the test, whatever the test (or a benchmark arm) patches."""
    for module in newton_schulz_modules(cls):
        monkeypatch.setattr(module, "zero_power_via_newton_schulz_5", module.zero_power_via_newton_schulz_5)
