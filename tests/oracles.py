"""Independent dense test oracles for Symo, written from the definitions (docs/theory.md).

Nothing here imports ``symo`` or ``compiler``: these are brute-force reference computations
(enumerate the group, build P x P matrices, average) that the library's structured formulas are
checked against. Everything is float64 and meant for small layouts only. The dense linear algebra over the
flattened parameter vector (orbit averages of one vector, powers, Hessians) is in tests/oracles_dense.py.

Layout description (deliberately independent of the spec language):

- ``spaces: dict[name, (kind, size, per)]`` with kind in {"identity", "perm", "signed_perm",
  "orthogonal"} and ``per`` either None or the name of an ``identity`` owner space. A space with
  ``per=owner`` has one independent group element for every index of the owner.
- ``params: list[(name, shape, axes)]`` with one axis descriptor per dimension:

  * ``"_"``: a free axis (nothing acts);
  * ``"h"``: a space name;
  * ``("head", "dqk")``: a product axis, row-major (einops "(head dqk)"): flat index
    ``i_head * n_dqk + i_dqk``;
  * ``[("_", 4), "h", ("a", "b")]``: a fused axis, segments concatenated in order. A segment is
    ``("_", size)`` (free), a space name, or a product tuple.

  The same space name anywhere in the layout is acted on by the SAME group element. A ``per``
  space must occur together with its owner, exactly once, in the same parameter (and, for fused
  axes, in every block that contains it), e.g. ``("head", "dqk")`` or axes ``["head", "dqk", "_"]``.

Flattening order everywhere: parameters in list order, each tensor row-major.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

DTYPE = torch.float64

Segment = str | tuple
Axis = str | tuple | list
SpaceSpec = tuple[str, int, str | None]
ParamSpec = tuple[str, Sequence[int], Sequence[Axis]]
Element = dict[str, torch.Tensor | tuple[torch.Tensor, ...]]

KINDS = ("identity", "perm", "signed_perm", "orthogonal")


# --------------------------------------------------------------------------------------------
# Groups
# --------------------------------------------------------------------------------------------


def _perm_matrix(perm: Sequence[int]) -> torch.Tensor:
    """Matrix P with P[perm[i], i] = 1, so (P x)[perm[i]] = x[i]."""
    n = len(perm)
    m = torch.zeros(n, n, dtype=DTYPE)
    m[list(perm), list(range(n))] = 1.0
    return m


def group_elements(kind: str, n: int) -> list[torch.Tensor]:
    """All n x n float64 matrices of the group ``kind`` acting on R^n.

    - "identity": [I].
    - "perm": the n! permutation matrices (S_n).
    - "signed_perm": the 2^n n! signed permutation matrices (B_n; |B_3| = 48, |B_4| = 384).
    - "orthogonal": the signed permutation matrices again. This finite stand-in for Haar O(n) is
      EXACT for everything the tests of single-occurrence layouts average. For Q uniform on B_n,
      E[Q_ia] = 0 and E[Q_ia Q_jb] = delta_ij delta_ab / n, which are exactly the Haar first and
      second moments. In those layouts every space occurs at most once in each
      parameter, so every entry of A_g v and of A_g v v^T A_g^T is a polynomial of degree at most
      one (resp. two: one factor from each side) in the entries of each Q; their averages
      therefore only involve these moments and coincide with the Haar averages.
      It is NOT exact for layouts with a space repeated within one parameter (docs/repeated_spaces.md):
      fourth moments of B_n and O(n) differ (commutant of R^n (x) R^n: 4 versus 3).
    """
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if kind == "identity":
        return [torch.eye(n, dtype=DTYPE)]
    if kind == "perm":
        return [_perm_matrix(p) for p in itertools.permutations(range(n))]
    if kind in ("signed_perm", "orthogonal"):
        out = []
        for p in itertools.permutations(range(n)):
            pm = _perm_matrix(p)
            for signs in itertools.product((1.0, -1.0), repeat=n):
                out.append(pm * torch.tensor(signs, dtype=DTYPE))  # P @ diag(signs)
        return out
    raise ValueError(f"unknown group kind {kind!r}; expected one of {KINDS}")


def haar_orthogonal(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """One Haar-distributed n x n orthogonal matrix (float64).

    QR of a standard Gaussian, with the columns of Q multiplied by sign(diag R): without the sign
    fix the distribution depends on the QR implementation's sign convention and is not Haar.
    """
    z = torch.randn(n, n, dtype=DTYPE, generator=generator)
    q, r = torch.linalg.qr(z)
    s = torch.sign(torch.diagonal(r))
    s = torch.where(s == 0, torch.ones_like(s), s)
    return (q * s).contiguous()


def random_group_element(kind: str, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """One uniformly random element of the group (Haar for "orthogonal")."""
    if kind == "identity":
        return torch.eye(n, dtype=DTYPE)
    if kind == "orthogonal":
        return haar_orthogonal(n, generator)
    if kind in ("perm", "signed_perm"):
        m = _perm_matrix(torch.randperm(n, generator=generator).tolist())
        if kind == "signed_perm":
            signs = torch.randint(0, 2, (n,), generator=generator).to(DTYPE) * 2 - 1
            m = m * signs
        return m
    raise ValueError(f"unknown group kind {kind!r}; expected one of {KINDS}")


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


def _is_free_segment(x: object) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and x[0] == "_" and isinstance(x[1], int)


def _check_spaces(spaces: dict[str, SpaceSpec]) -> None:
    for name, (kind, size, per) in spaces.items():
        if kind not in KINDS:
            raise ValueError(f"space {name!r}: unknown kind {kind!r}")
        if size < 1:
            raise ValueError(f"space {name!r}: size must be positive")
        if per is not None:
            if per not in spaces:
                raise ValueError(f"space {name!r}: owner {per!r} is not declared")
            if spaces[per][0] != "identity" or spaces[per][2] is not None:
                raise ValueError(f"space {name!r}: owner {per!r} must be a plain identity space")


def _segments(axis: Axis) -> list[Segment]:
    """An axis as a list of segments (a non-fused axis is one segment)."""
    if isinstance(axis, list):
        return list(axis)
    return [axis]


def _factors(segment: Segment) -> list[str] | None:
    """Space names of a segment, or None for a free segment."""
    if segment == "_" or _is_free_segment(segment):
        return None
    if isinstance(segment, str):
        return [segment]
    if isinstance(segment, tuple) and all(isinstance(s, str) and s != "_" for s in segment):
        return list(segment)
    raise ValueError(f"bad axis segment {segment!r}")


def _segment_size(segment: Segment, spaces: dict[str, SpaceSpec], axis_dim: int, only: bool) -> int:
    if segment == "_":
        if not only:
            raise ValueError("a free segment inside a fused axis must be written ('_', size)")
        return axis_dim
    if _is_free_segment(segment):
        return segment[1]
    names = _factors(segment)
    for s in names:
        if s not in spaces:
            raise ValueError(f"unknown space {s!r}")
    return math.prod(spaces[s][1] for s in names)


def param_size(params: Sequence[ParamSpec]) -> int:
    """Total number of scalars P of the flattened parameter vector."""
    return sum(math.prod(shape) for _, shape, _ in params)


def _check_layout(spaces: dict[str, SpaceSpec], params: Sequence[ParamSpec]) -> None:
    _check_spaces(spaces)
    for name, shape, axes in params:
        if len(shape) != len(axes):
            raise ValueError(f"param {name!r}: {len(shape)} dims but {len(axes)} axes")
        for dim, axis in zip(shape, axes):
            segs = _segments(axis)
            total = sum(_segment_size(s, spaces, dim, len(segs) == 1) for s in segs)
            if total != dim:
                raise ValueError(f"param {name!r}: axis {axis!r} has size {total}, shape says {dim}")
        for combo in itertools.product(*(_axis_segments(a, d, spaces) for a, d in zip(axes, shape))):
            _block_owners(name, combo, spaces)


def _kron_all(mats: Sequence[torch.Tensor]) -> torch.Tensor:
    out = torch.ones(1, 1, dtype=DTYPE)
    for m in mats:
        out = torch.kron(out, m.contiguous())
    return out


def _axis_segments(axis: Axis, dim: int, spaces: dict[str, SpaceSpec]) -> list[tuple[int, int, list[str] | None]]:
    """(offset, size, space names or None if free) for each segment of an axis."""
    segs = _segments(axis)
    out, offset = [], 0
    for seg in segs:
        size = _segment_size(seg, spaces, dim, len(segs) == 1)
        out.append((offset, size, _factors(seg)))
        offset += size
    return out


def _block_owners(name: str, combo: Sequence[tuple], spaces: dict[str, SpaceSpec]) -> list[str]:
    """Owners needed by the per-spaces of one block (one segment per axis); checks each is there once."""
    used = [s for _, _, names in combo if names for s in names]
    owners = sorted({spaces[s][2] for s in used if spaces[s][2] is not None})
    for owner in owners:
        if used.count(owner) != 1:
            raise ValueError(
                f"param {name!r}: a per-space of {owner!r} needs its owner exactly once "
                f"in the same block (segments {[c[2] for c in combo]})"
            )
    return owners


def _factor_matrix(
    name: str, spaces: dict[str, SpaceSpec], element: Element, owner_index: dict[str, int]
) -> torch.Tensor:
    kind, size, per = spaces[name]
    if per is not None:
        return element[name][owner_index[per]]
    if name in owner_index:  # an owner: identity, restricted to the current owner index
        e = torch.zeros(size, size, dtype=DTYPE)
        e[owner_index[name], owner_index[name]] = 1.0
        return e
    return element[name]


def param_action_matrix(spaces: dict[str, SpaceSpec], param: ParamSpec, element: Element) -> torch.Tensor:
    """Dense action of one group element on one (row-major flattened) parameter.

    The parameter's index set is a direct sum of blocks, one block per choice of one segment on
    every axis (a fused axis contributes one segment at a time). On a block the action is the
    Kronecker product of the factor matrices (identity on free segments); with per-spaces it is
    the sum over the owner index o of that product with the owner replaced by e_o e_o^T and each
    per-space by its element for o (a block-diagonal action). Blocks are scattered back to their
    row-major flat indices.
    """
    name, shape, axes = param
    shape = tuple(shape)
    n = math.prod(shape)
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
    out = torch.zeros(n, n, dtype=DTYPE)
    for combo in itertools.product(*(_axis_segments(a, d, spaces) for a, d in zip(axes, shape))):
        owners = _block_owners(name, combo, spaces)
        block = None
        for idx in itertools.product(*(range(spaces[o][1]) for o in owners)):
            owner_index = dict(zip(owners, idx))
            mats = [
                torch.eye(size, dtype=DTYPE)
                if names is None
                else _kron_all([_factor_matrix(s, spaces, element, owner_index) for s in names])
                for _, size, names in combo
            ]
            term = _kron_all(mats)
            block = term if block is None else block + term
        flat = torch.zeros((), dtype=torch.long)
        for (offset, size, _), stride in zip(combo, strides):
            flat = flat.unsqueeze(-1) + (torch.arange(offset, offset + size) * stride)
        flat = flat.reshape(-1)  # row-major over the block, matching the Kronecker order
        out[flat[:, None], flat[None, :]] = block
    return out


def action_matrix(spaces: dict[str, SpaceSpec], params: Sequence[ParamSpec], element: Element) -> torch.Tensor:
    """Dense P x P matrix A_g of one group element on the flattened parameter vector."""
    _check_layout(spaces, params)
    return torch.block_diag(*(param_action_matrix(spaces, p, element) for p in params))


def enumerate_elements(spaces: dict[str, SpaceSpec]) -> list[Element]:
    """Every element of the product group over ALL declared spaces.

    An element maps each space name to its matrix, or, for a per-space, to a tuple of matrices
    (one per owner index). "orthogonal" spaces use B_n (see ``group_elements``).
    """
    _check_spaces(spaces)
    names = list(spaces)
    choices = []
    for name in names:
        kind, size, per = spaces[name]
        elems = group_elements(kind, size)
        if per is None:
            choices.append(elems)
        else:
            choices.append(list(itertools.product(elems, repeat=spaces[per][1])))
    return [dict(zip(names, combo)) for combo in itertools.product(*choices)]


def group_order(spaces: dict[str, SpaceSpec]) -> int:
    """Number of elements ``enumerate_elements`` yields, without enumerating them."""
    order = 1
    for kind, size, per in spaces.values():
        k = {"identity": 1, "perm": math.factorial(size)}.get(kind, 2**size * math.factorial(size))
        order *= k ** (spaces[per][1] if per is not None else 1)
    return order


def action_matrices(
    spaces: dict[str, SpaceSpec], params: Sequence[ParamSpec], max_elements: int = 20000
) -> list[torch.Tensor]:
    """Dense A_g (P x P, float64) for EVERY element g of the (finite) product group.

    The product is over all declared spaces (for per-spaces, over owner indices too); spaces no
    parameter uses just repeat matrices, which does not change averages. "orthogonal" spaces are
    enumerated as B_n, exact for first and second moments of single-occurrence layouts (see ``group_elements``).
    """
    _check_layout(spaces, params)
    if group_order(spaces) > max_elements:
        raise ValueError(f"group has {group_order(spaces)} elements > max_elements={max_elements}")
    return [action_matrix(spaces, params, g) for g in enumerate_elements(spaces)]


def random_element(spaces: dict[str, SpaceSpec], generator: torch.Generator | None = None) -> Element:
    """One random group element (Haar samples for "orthogonal" spaces)."""
    _check_spaces(spaces)
    out: Element = {}
    for name, (kind, size, per) in spaces.items():
        if per is None:
            out[name] = random_group_element(kind, size, generator)
        else:
            out[name] = tuple(random_group_element(kind, size, generator) for _ in range(spaces[per][1]))
    return out


def sample_action(
    spaces: dict[str, SpaceSpec],
    params: Sequence[ParamSpec],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One random A_g (Haar for orthogonal spaces): for Monte Carlo and invariance tests."""
    return action_matrix(spaces, params, random_element(spaces, generator))
