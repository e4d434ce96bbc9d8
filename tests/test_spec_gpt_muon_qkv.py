"""The bundled spec gpt_muon_qkv: c_attn's query, key and value rows as three matrices.

Oracles: the float64 SVD's polar factor of each third of the gradient (Muon's first step), pytorch-optimizer's SOAP
run on three separate d x d tensors (SOAP-Muon's direction, before the first refresh), and Symo itself on three
separate parameters (every step, refreshes included): splitting a matrix's rows in the spec is the same as making
them separate matrices.
"""

from __future__ import annotations

import pytest
import torch
from helpers import F64, muons_first_step_on_gpt, polar, rel

import symo
from symo.train import TrainConfig
from symo.train.models import GPT, GPTConfig
from symo.train.optimizers import build_optimizer, head_basis_sizes

SPLIT = ('[spaces]\npart = { group = "identity", size = 3 }\nrows = { group = "signed_perm", per = "part" }\n'
         '[params]\nw = ["(part rows)", "_"]\n')
THREE = ('[spaces]\nq = "signed_perm"\nk = "signed_perm"\nv = "signed_perm"\n'
         '[params]\nwq = ["q", "_"]\nwk = ["k", "_"]\nwv = ["v", "_"]\n')
SOAP_MUON = {"preset": "soap_muon", "stats_dtype": "float64", "nesterov": False}


def loss_grad(w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The gradient of a fixed non-quadratic loss at w (3d x d), whose thirds interact through w w^T."""
    w = w.detach().requires_grad_(True)
    (((w - target) ** 3).sum() + (w @ w.T).square().sum()).backward()
    return w.grad


def split_and_three(d: int, dtype: torch.dtype, options: dict) -> tuple:
    """A 3d x d weight under SPLIT and its three thirds as separate parameters under THREE, each with its
    optimizer (lr 0.02, weight decay 0.1, `options`), and a target for loss_grad."""
    w = torch.nn.Parameter(torch.randn(3 * d, d, dtype=dtype))
    parts = {n: torch.nn.Parameter(p.clone()) for n, p in zip(("wq", "wk", "wv"), w.detach().split(d))}
    split = symo.Symo({"w": w}, symo.parse_spec(SPLIT), lr=0.02, weight_decay=0.1, **options)
    three = symo.Symo(parts, symo.parse_spec(THREE), lr=0.02, weight_decay=0.1, **options)
    return w, parts, split, three, torch.randn(3 * d, d, dtype=dtype)


def step_both(w, parts, split, three, target) -> None:
    """One step of both optimizers on the same gradients (the split weight's, cut into thirds)."""
    w.grad = loss_grad(w, target)
    for p, g in zip(parts.values(), w.grad.split(w.shape[1])):
        p.grad = g.clone()
    split.step()
    three.step()


def test_symo_train_builds_it_with_q_k_v_as_three_blocks():
    """`symo train --spec gpt_muon_qkv` builds: the spaces repeated per part of c_attn take their size from the
    shapes, where gpt_true's per-head bases take the head size."""
    assert head_basis_sizes(symo.load_spec("gpt_muon_qkv"), 4) is None
    assert head_basis_sizes(symo.load_spec("gpt_true"), 4) == {"dqk{i}": 4, "dvo{i}": 4}
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8))
    cfg = TrainConfig(spec="gpt_muon_qkv", optimizer="symo", n_layer=2, n_head=2, n_embd=8, block_size=8)
    described = build_optimizer(model, cfg).describe()
    assert "per qkv0: Y 3x8x8" in described and "per qkv1: Y 3x8x8" in described


def test_muons_step_moves_each_of_q_k_v_by_its_own_polar_factor():
    """Muon's first step (momentum and damping off, exact polar factor) on gpt_muon_qkv moves each third of c_attn by
    the polar factor of its own gradient, which is not the whole matrix's polar factor (scaled by Muon's sqrt(3));
    the other matrices move as under Muon. The GPT's gradients are rank-deficient (LayerNorm centres the input), so
    the oracle keeps the singular directions above rounding."""
    grads, moved = muons_first_step_on_gpt("gpt_muon_qkv")
    for n, g in grads.items():
        upd = moved[n]
        if "c_attn" in n:
            want = torch.cat([polar(part, tol=1e-10) for part in g.split(8)])
            assert rel(upd, want) < 1e-8 and rel(upd, 3 ** 0.5 * polar(g, tol=1e-10)) > 0.1, n
        else:
            assert rel(upd, max(1.0, g.shape[0] / g.shape[1]) ** 0.5 * polar(g, tol=1e-10)) < 1e-8, n


def test_soap_muon_on_the_split_is_the_polar_factor_of_soaps_direction_on_each_third():
    """SOAP-Muon on a 3d x d weight split in three: the first step moves nothing, and until the first refresh each
    third moves by lr polar(N_j), N_j pytorch-optimizer's SOAP direction on a separate d x d tensor fed that third's
    gradients."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    torch.manual_seed(0)
    d, lr = 5, 0.05
    w = torch.nn.Parameter(torch.randn(3 * d, d, dtype=F64))
    twins = [torch.nn.Parameter(part.clone()) for part in w.detach().split(d)]
    opt = symo.Symo({"w": w}, symo.parse_spec(SPLIT), lr=lr, backend="eigh", precondition_frequency=10, **SOAP_MUON)
    lib = pytorch_optimizer.SOAP(twins, lr=1.0, weight_decay=0.0, precondition_frequency=10)
    target = torch.randn(3 * d, d, dtype=F64)
    for t in range(8):
        w.grad = loss_grad(w, target)
        for twin, part in zip(twins, w.grad.split(d)):
            twin.grad = part.clone()
        before, lib_before = w.detach().clone(), [twin.detach().clone() for twin in twins]
        opt.step()
        lib.step()
        if t == 0:
            assert torch.equal(before, w.detach())
            continue
        want = torch.cat([lr * polar(b - twin.detach()) for b, twin in zip(lib_before, twins)])
        assert rel(before - w.detach(), want) < 1e-4, t


@pytest.mark.parametrize("options", [{**SOAP_MUON, "precondition_frequency": 4}, {"update_scale": "muon"}],
                         ids=["soap_muon", "muon_step"])
def test_rows_split_in_the_spec_step_as_three_separate_matrices(options):
    """30 steps with refreshes every 4: the split weight and three separate parameters (each with a private row
    space) given the same gradients stay equal, weight decay included: bit for bit under Muon's step, and under
    SOAP-Muon to 1e-4 of the distance moved (the stacked and the separate eigendecompositions round differently,
    and the first rotated step divides that rounding by eps)."""
    torch.manual_seed(1)
    w, parts, split, three, target = split_and_three(6, F64, options)
    start = w.detach().clone()
    for t in range(30):
        step_both(w, parts, split, three, target)
        moved = torch.cat([p.detach() for p in parts.values()]) - start
        assert rel(w.detach() - start, moved) < (1e-4 if "preset" in options else 1e-15), t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_the_dtypes_users_train_in(dtype):
    """float32 and bfloat16, 30 steps: under Muon's step the split weight still steps as three separate matrices
    (bit for bit in float32, to bfloat16's rounding in bfloat16). Under SOAP-Muon the two only agree to rounding,
    which its Adam step in a rotated basis turns into O(1) moves, as between any two runs of SOAP (README, "Two runs
    of one SOAP end apart"): both stay finite and move."""
    torch.manual_seed(1)
    for options in ({"update_scale": "muon"}, {**SOAP_MUON, "stats_dtype": "float32", "precondition_frequency": 4}):
        w, parts, split, three, target = split_and_three(6, dtype, options)
        start = w.detach().clone()
        for _ in range(30):
            step_both(w, parts, split, three, target)
        together = torch.cat([p.detach() for p in parts.values()])
        assert torch.isfinite(w).all() and torch.isfinite(together).all() and not torch.equal(w.detach(), start)
        if "preset" in options:
            continue
        if dtype == torch.float32:
            assert torch.equal(w.detach(), together)
        else:
            assert rel((w.detach() - start).float(), (together - start).float()) < 0.05
