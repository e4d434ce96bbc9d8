"""NorMuon's neuron-wise normalization (Li et al. 2025, "NorMuon: making Muon more efficient and scalable") of a
polar-factor kind's update, per covered matrix:

    Z = the kind's update, as rows x (the rest flattened)      (a row: one output unit's weights)
    v <- beta2 v + (1 - beta2) mean_j Z_ij^2                  (per row, kept in the parameter's state)
    Z <- Z / (sqrt(v) + 1e-10), then rescaled to ||Z||_F before

A polar factor gives every direction the same size, but not every neuron: a row's share of the update follows the
gradient's. Dividing each row by a running root of its mean square evens the neurons out; rescaling keeps the
kind's step size, Muon's per-shape factor sqrt(max(1, rows / cols)) included, so the learning rate keeps its
meaning (`update_scale="muon"`: Muon's rates). With Symo's `preset="muon"` on a Muon-style spec this is
pytorch-optimizer's `NorMuon` at its defaults (`preserve_norm`, tests/test_neuron_norm.py).

The statistic is per row, so a spec that permutes or sign-flips a matrix's rows (every Muon-style spec) moves it
with them: the step stays equivariant. A rotation of the rows mixes them, so `check_rows` refuses a spec whose
orthogonal space acts on a covered matrix's rows (a true-symmetry spec's attention heads). Parameters of one
dimension keep the kind's update.

On several processes each rank normalizes the rows it holds: under DDP ("replicated") the whole update, under
FSDP2 ("fsdp") its rows of a dim-0 shard, whose statistic is a DTensor sharded as the parameter is (so
torch.distributed.checkpoint saves and reshards it). A row's statistic is its own; the norm the update is rescaled
to is the whole matrix's, so FSDP2 sums the shards' squares in one all-reduce per step for every matrix at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch.distributed.tensor import DTensor

from ..runtime.compiled import CompiledSpec

EPS = 1e-10  # NorMuon's, under the root
STATE_KEY = "neuron_second_moment"
KINDS = ("polar", "then_orthogonalize")


def check_rows(compiled: CompiledSpec, kind: str) -> None:
    """ValueError unless the kind ends in a polar factor and no orthogonal space acts on a covered matrix's rows."""
    if kind not in KINDS:
        raise ValueError(f"neuron_norm_beta2 normalizes the rows of a polar factor; preconditioner {kind!r} has none: "
                         "use preset='muon', 'then_orthogonalize' or 'soap_muon', or leave neuron_norm_beta2=None")
    for name in compiled.param_names:
        if len(compiled.shapes[name]) < 2:
            continue
        rotated = sorted({space for space in compiled.axis_spaces(name, 0)
                          if compiled.spaces[space]["group"] == "orthogonal"})
        if rotated:
            raise ValueError(
                f"neuron_norm_beta2: spec {compiled.name!r} rotates the rows of {name!r} (orthogonal space "
                f"{rotated[0]!r} on its axis 0); a per-row statistic would not rotate with them. Use a spec whose "
                "rows are permuted, sign-flipped or free (a Muon-style spec), or leave neuron_norm_beta2=None")


def row_statistic_zeros(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Zeros, one per row of `p`, placed as `p` is: a DTensor on `p`'s mesh and placements (an FSDP2 shard holds
    its rows' statistics), a plain tensor otherwise."""
    if not isinstance(p, DTensor):
        return torch.zeros(p.shape[0], 1, dtype=dtype, device=p.device)
    local = torch.zeros(p.to_local().shape[0], 1, dtype=dtype, device=p.device)
    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=(p.shape[0], 1),
                              stride=(1, 1))


def normalize(updates: dict[str, torch.Tensor], states: Mapping[str, dict], beta2: float,
              params: Mapping[str, torch.Tensor], all_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
              sharded: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """`updates` (plain tensors: whole, or this rank's rows of the parameters named in `sharded`) with the rows of
    each matrix that steps (a key of `states`) normalized; each parameter's state keeps its rows' EMA, created at
    zero placed as its parameter in `params` is. `all_sum` sums a tensor over the ranks: the squares of the
    `sharded` updates, so that each is rescaled to its whole matrix's norm."""
    out = dict(updates)
    rows_of: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, st in states.items():  # the parameters that step (a frozen one's update is never applied)
        z = updates[name]
        if z.ndim < 2:
            continue
        rows = z.reshape(z.shape[0], -1)
        work = rows if rows.dtype == torch.float64 else rows.float()
        if STATE_KEY not in st:
            st[STATE_KEY] = row_statistic_zeros(params[name], work.dtype)
        v = st[STATE_KEY].to_local() if isinstance(st[STATE_KEY], DTensor) else st[STATE_KEY]
        v.lerp_(work.square().mean(dim=1, keepdim=True), 1 - beta2)
        rows_of[name] = work, work / (v.sqrt() + EPS)
    # each matrix's norm before and after; a shard's from its squares summed over the ranks
    norms = {n: (w.norm(), x.norm()) for n, (w, x) in rows_of.items() if n not in sharded or all_sum is None}
    split = [n for n in rows_of if n not in norms]
    if split:
        squares = all_sum(torch.stack([torch.stack([w.square().sum(), x.square().sum()]).double()
                                       for w, x in (rows_of[n] for n in split)]))
        norms.update((n, tuple(sq.sqrt().to(rows_of[n][0].dtype))) for n, sq in zip(split, squares))
    for name, (_, normalized) in rows_of.items():
        before, after = norms[name]
        normalized = normalized * (before / (after + EPS))
        out[name] = normalized.reshape(updates[name].shape).to(updates[name].dtype)
    return out


__all__ = ["EPS", "KINDS", "STATE_KEY", "check_rows", "normalize", "row_statistic_zeros"]
