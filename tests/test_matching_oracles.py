"""Weight matching's solvers (symo/alignment/matching.py) against oracles that do not share its code: each
group's linear maximum and the joint head step by exhaustive enumeration, and planted problems, where `ref` is
`other` moved by a known group element g, so the maximum of sum_p <ref_p, (A_g other)_p> is |ref|^2 (Cauchy-
Schwarz: the action is orthogonal) and is reached exactly where the element moves `other` onto `ref`.

The cases are the ones the broader alignment tests leave open: heads whose sign a head-level parameter sees,
two per-head spaces in one block, an objective that is exactly 0 at the identity, random starts with per-head
spaces, and a space that occurs twice in a block (the objective is quadratic there)."""

from __future__ import annotations

import itertools

import pytest
import torch

import symo
from symo.alignment.heads import head_pair_terms
from symo.alignment.matching import identity_element, weight_matching
from symo.alignment.solve import best_values, solve_heads
from symo.runtime.compiled import CompiledSpec

pytestmark = pytest.mark.usefixtures("one_thread_module")


def compiled(text: str, shapes: dict[str, tuple[int, ...]], sizes: dict[str, int] | None = None) -> CompiledSpec:
    return symo.compile(symo.parse_spec(text), shapes, sizes=sizes, disk_cache=False)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def planted(c: CompiledSpec, shapes: dict[str, tuple[int, ...]], seed: int,
            element: dict[str, torch.Tensor] | None = None) -> tuple[dict, dict, dict, float]:
    """(ref, other, g, |ref|^2) with ref = A_g other: the objective's maximum is |ref|^2, reached at g."""
    other = {n: randn(*shape, seed=seed + i) for i, (n, shape) in enumerate(shapes.items())}
    g = c.random_element(torch.Generator().manual_seed(seed)) if element is None else element
    ref = c.act(g, other)
    return ref, other, g, sum(float((t * t).sum()) for t in ref.values())


def signed_perm_matrices(n: int) -> list[torch.Tensor]:
    out = []
    for perm in itertools.permutations(range(n)):
        for signs in itertools.product((1.0, -1.0), repeat=n):
            m = torch.zeros(n, n, dtype=torch.float64)
            m[list(range(n)), list(perm)] = torch.tensor(signs, dtype=torch.float64)
            out.append(m)
    return out


def group_elements(group: str, n: int) -> list[torch.Tensor]:
    """Every element of a finite group of n x n matrices, enumerated."""
    if group == "identity":
        return [torch.eye(n, dtype=torch.float64)]
    every = signed_perm_matrices(n)
    return every if group == "signed_perm" else [m for m in every if bool((m >= 0).all())]


# --------------------------------------------------------------------------- the linear solves, enumerated
@pytest.mark.parametrize("group", ["identity", "perm", "signed_perm"])
def test_best_values_is_the_maximum_over_the_enumerated_group(group: str) -> None:
    c = randn(2, 3, 3, 3, seed=1)  # a batch: best_values keeps the leading shape
    elements = group_elements(group, 3)
    expected = torch.stack([torch.stack([(e * m).sum() for e in elements]).max() for m in c.reshape(-1, 3, 3)])
    assert best_values(group, c).shape == (2, 3)
    torch.testing.assert_close(best_values(group, c).reshape(-1), expected, rtol=1e-12, atol=1e-12)


def test_best_values_for_rotations_is_the_nuclear_norm_and_no_sampled_rotation_beats_it() -> None:
    c = randn(4, 3, 3, seed=2)
    values = best_values("orthogonal", c)
    torch.testing.assert_close(values, torch.linalg.matrix_norm(c, "nuc"), rtol=1e-12, atol=1e-12)
    q, _ = torch.linalg.qr(randn(500, 3, 3, seed=3))
    sampled = torch.einsum("sij,cij->cs", q, c).max(-1).values
    assert bool((sampled <= values + 1e-12).all())


@pytest.mark.parametrize("owner", ["perm", "signed_perm"])
def test_the_joint_head_step_is_the_maximum_over_every_head_pairing_sign_and_per_head_element(owner: str) -> None:
    """sum_ab P_ab (C0[a, b] + <R_a, C[a, b]>) over the owner's P and per-head signed permutations R_a, all of
    them enumerated (48 signed pairings of 3 heads, 8 elements per head)."""
    n, m = 3, 2
    c0, cross = randn(n, n, seed=4), randn(n, n, m, m, seed=5)
    q, rotations, value = solve_heads(owner, c0, {"t": ("signed_perm", cross)})
    per_head = group_elements("signed_perm", m)
    best = -float("inf")
    for p in group_elements(owner, n):
        total = 0.0
        for a in range(n):
            b = int(p[a].abs().argmax())
            sign = float(p[a, b])
            total += max(sign * (float(c0[a, b]) + float((r * cross[a, b]).sum())) for r in per_head)
        best = max(best, total)
    assert value == pytest.approx(best, rel=1e-12)
    reached = float((q * c0).sum() + (q * torch.einsum("aij,abij->ab", rotations["t"], cross)).sum())
    assert reached == pytest.approx(best, rel=1e-12)  # the returned element attains the maximum it reports
    if owner == "signed_perm":  # on these draws a head pair's best sign is -1: the step must be able to pick it
        assert bool((q < 0).any())


# --------------------------------------------------------------------------- planted problems
SIGNED_HEADS = '''name = "signed heads with a head-level parameter"
[spaces]
head = { group = "signed_perm" }
dqk  = { group = "orthogonal", per = "head", size = 2 }
[params]
"q" = ["(head dqk)", "_"]
"g" = ["head", "_"]
'''


def test_signed_heads_seen_by_a_head_level_parameter_are_recovered_with_their_signs() -> None:
    """`g` moves with the heads alone (no per-head rotation absorbs a head's sign), so a head whose planted sign is
    -1 is only matched by a step that can flip it."""
    shapes = {"q": (8, 5), "g": (4, 5)}
    c = compiled(SIGNED_HEADS, shapes, sizes={"head": 4})
    element = c.random_element(torch.Generator().manual_seed(6))
    assert bool((element["head"] < 0).any())
    ref, other, _, maximum = planted(c, shapes, seed=7, element=element)
    result = weight_matching(c, ref, other)
    assert result.objective_after == pytest.approx(maximum, rel=1e-9)
    moved = c.act(result.elements, other)
    for n in shapes:
        torch.testing.assert_close(moved[n], ref[n], rtol=1e-9, atol=1e-9)


TWO_PER_HEAD_IN_ONE_BLOCK = '''name = "two per-head spaces in one block"
[spaces]
head = { group = "perm" }
a = { group = "orthogonal", per = "head", size = 2 }
b = { group = "orthogonal", per = "head", size = 2 }
[params]
"w" = ["(head a b)", "_"]
"x" = ["(head a)", "_"]
'''


def test_two_per_head_spaces_in_one_block_have_no_pairwise_head_terms() -> None:
    """With a and b in one block the objective is bilinear in (R_a, R_b) per head pair, not a sum of one term per
    space: no (C0, C_t) split exists, and the joint head step must decline (the owner is then solved alone)."""
    shapes = {"w": (12, 3), "x": (6, 3)}
    c = compiled(TWO_PER_HEAD_IN_ONE_BLOCK, shapes, sizes={"head": 3})
    ref, other, _, maximum = planted(c, shapes, seed=8)
    assert head_pair_terms(c, identity_element(c, torch.float64), "head", ["a", "b"], ref, other) is None
    result = weight_matching(c, ref, other)
    assert result.objective_before <= result.objective_after <= maximum * (1 + 1e-12)


TWO_SIDED = '''name = "two permuted sides of one matrix"
[spaces]
rows = { group = "perm" }
cols = { group = "perm" }
[params]
"w" = ["rows", "cols"]
'''


def test_a_match_is_found_where_the_identity_scores_exactly_zero() -> None:
    """ref = I and other = the same rows swapped: at the identity the objective is exactly 0, and either side's
    swap scores 2. An improvement threshold relative to |objective| must still accept it."""
    c = compiled(TWO_SIDED, {"w": (2, 2)})
    ref = {"w": torch.eye(2, dtype=torch.float64)}
    other = {"w": torch.eye(2, dtype=torch.float64)[[1, 0]]}
    result = weight_matching(c, ref, other)
    assert result.objective_before == 0.0
    assert result.objective_after == 2.0


HEADS_IN_PLACE = '''name = "heads in place, each rotated"
[spaces]
head = { group = "identity" }
dqk  = { group = "orthogonal", per = "head", size = 2 }
[params]
"q" = ["(head dqk)", "_"]
"k" = ["(head dqk)", "_"]
'''


def test_random_starts_draw_one_element_per_head_and_reach_the_planted_rotations() -> None:
    shapes = {"q": (6, 4), "k": (6, 4)}
    c = compiled(HEADS_IN_PLACE, shapes, sizes={"head": 3})
    ref, other, _, maximum = planted(c, shapes, seed=9)
    for restarts in (0, 3):
        result = weight_matching(c, ref, other, restarts=restarts, seed=1)
        assert result.elements["dqk"].shape == (3, 2, 2)
        assert result.objective_after == pytest.approx(maximum, rel=1e-9)


RECURRENT = '''name = "a recurrent matrix: its space on both sides"
[spaces]
h = { group = "perm" }
[params]
"w" = ["h", "h"]
'''


@pytest.mark.parametrize("seed", [10, 12, 13])
def test_steps_on_a_repeated_space_gain_what_the_objective_gains(seed: int) -> None:
    """For W -> Q W Q^T the objective is quadratic in Q. The recorded history adds each step's gain; it must end at
    the objective measured afresh (a step scored by its linearisation, or a gain added with the wrong sign, would
    not), rise monotonically, and the descent must move off the identity."""
    c = compiled(RECURRENT, {"w": (6, 6)})
    ref, other, _, maximum = planted(c, {"w": (6, 6)}, seed=seed)
    result = weight_matching(c, ref, other)
    assert result.objective_after > result.objective_before + 1e-6
    assert result.history[-1] == pytest.approx(result.objective_after, rel=1e-9, abs=1e-9)
    assert all(b >= a - 1e-12 for a, b in zip(result.history, result.history[1:]))
    assert result.objective_after <= maximum * (1 + 1e-12)
