"""The alignment room's edges the other alignment tests leave open (found by mutation testing,
scripts/mutation.sh), each checked against an independent oracle: the report's documented columns and
phrases (docs/align.md, `AlignResult.report`'s docstring) and the per-group element forms documented on
`AlignResult.elements`, built here from known permutations, signs and rotations."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import pytest
import torch
from cases import relu_mlp_pair
from torch import nn

from symo.alignment import AlignError, AlignWarning, align, barrier, interpolate
from symo.alignment.merge import BarrierResult
from symo.alignment.result import AlignResult, SpaceReport, readable_elements
from symo.train.models import MLP


def _space(name: str, per: str | None = None, copies: int = 1, last_changed: int = 0,
           identity: bool = True, method: str = "assignment") -> SpaceReport:
    return SpaceReport(name=name, group="perm", size=6, per=per, copies=copies, method=method, before=0.25,
                       after=0.75, last_changed=last_changed, identity=identity)


def _result(spaces: list[SpaceReport], sweeps: int = 2, start: str = "identity", converged: bool = True,
            relaxed: list[str] | None = None) -> AlignResult:
    return AlignResult(model=None, elements={}, matrices={}, compiled=SimpleNamespace(name="tiny"),
                       method="weights", spaces=spaces, objective_before=1.0, objective_after=2.0,
                       sweeps=sweeps, start=start, seconds={"match": 0.5, "total": 1.25},
                       relaxed=relaxed or [], converged=converged)


def test_the_report_header_names_the_documented_columns() -> None:
    """The docstring's columns, in order: space, group, n, method, before, after, last changed."""
    lines = _result([_space("h1")]).report().splitlines()
    assert lines[1].split() == ["space", "group", "n", "method", "before", "after", "last", "changed"]
    row = lines[2].split()
    assert row[:4] == ["h1", "perm", "6", "assignment"] and [float(v) for v in row[4:6]] == [0.25, 0.75]


def test_the_report_counts_sweeps_in_english_and_names_a_start_other_than_the_identity() -> None:
    one = _result([_space("h1")], sweeps=1).report().splitlines()[0]
    assert one.endswith(": 1 spaces matched, 1 sweep"), one
    two = _result([_space("h1")], sweeps=2, start="solo").report().splitlines()[0]
    assert two.endswith("2 sweeps, best run started from solo"), two
    assert "best run started" not in _result([_space("h1")], start="identity").report()


def test_the_report_shows_a_per_space_with_its_owner_and_copies() -> None:
    """A `per` space has one element per index of its owner: the group column says which and how many."""
    report = _result([_space("dqk", per="head", copies=4), _space("h1")]).report().splitlines()
    assert report[2].split()[1:5] == ["perm", "per", "head", "(x4)"], report
    assert report[3].split()[1:3] == ["perm", "6"], report  # no owner: the group alone


def test_the_report_lists_relaxed_spaces_and_the_times() -> None:
    report = _result([_space("h1")], relaxed=["res", "h2"]).report().splitlines()
    assert "not true symmetries of the model (the aligned model computes another function): res, h2" in report
    assert report[-1] == "time: match 0.50 s, total 1.25 s"
    assert not any("not true symmetries" in line for line in _result([_space("h1")]).report().splitlines())


def _perm_matrix(p: list[int], signs: list[float] | None = None) -> torch.Tensor:
    """Row i has its one nonzero at column p[i]: x'_i = signs_i x_{p_i} (the docstring's convention)."""
    m = torch.zeros(len(p), len(p))
    for i, j in enumerate(p):
        m[i, j] = 1.0 if signs is None else signs[i]
    return m


def test_readable_elements_keeps_one_element_per_copy_of_a_per_space() -> None:
    compiled = SimpleNamespace(spaces={"a": {"group": "perm", "per": None}, "b": {"group": "perm", "per": "h"},
                                       "c": {"group": "signed_perm", "per": None},
                                       "d": {"group": "signed_perm", "per": "h"},
                                       "e": {"group": "orthogonal", "per": None},
                                       "f": {"group": "identity", "per": None}})
    perms = [[2, 0, 1], [1, 2, 0]]
    signs = [[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]]
    q = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))[0]
    matrices = {"a": _perm_matrix(perms[0])[None],
                "b": torch.stack([_perm_matrix(p) for p in perms]),
                "c": _perm_matrix(perms[1], signs[0])[None],
                "d": torch.stack([_perm_matrix(p, s) for p, s in zip(perms, signs)]),
                "e": q[None], "f": torch.eye(3)[None]}
    out = readable_elements(compiled, matrices)
    assert set(out) == {"a", "b", "c", "d", "e"}  # identity spaces left out
    assert out["a"].tolist() == perms[0]
    assert out["b"].tolist() == perms
    assert out["c"][0].tolist() == perms[1] and out["c"][1].tolist() == signs[0]
    assert out["d"][0].tolist() == perms and out["d"][1].tolist() == signs
    assert torch.equal(out["e"], q)


# ------------------------------------------------ align(): arguments, messages and the per-space cosines
def test_the_sweep_limit_message_names_the_cli_flag() -> None:
    """docs/align.md documents the flag as `--max-sweeps`."""
    a, b = relu_mlp_pair()
    with pytest.raises(AlignError, match=r"max_sweeps must be an integer >= 1 \(CLI: --max-sweeps\), got 0"):
        align(a, b, "mlp_relu", max_sweeps=0)


def test_a_state_dict_on_either_side_is_not_checked_and_says_so() -> None:
    """The symmetry check runs the models: with a state dict on either side there is none to run."""
    a, b = relu_mlp_pair()
    for ref, other in ((a, b.state_dict()), (a.state_dict(), b), (a.state_dict(), b.state_dict())):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AlignWarning)
            result = align(ref, other, "mlp_relu")
        unchecked = [n for n in result.notes if n.startswith("symmetry not checked")]
        assert len(unchecked) == 1 and unchecked[0].startswith("symmetry not checked (state dicts"), result.notes
        assert not result.relaxed


def test_a_model_aligned_to_itself_reports_cosines_of_one() -> None:
    """<W, W> / (|W| |W|) = 1 for every space, before and after (the identity is optimal)."""
    a, _ = relu_mlp_pair()
    result = align(a, copy.deepcopy(a), "mlp_relu", check=False)
    for s in result.spaces:
        assert s.before == pytest.approx(1.0, abs=1e-9) and s.after == pytest.approx(1.0, abs=1e-9), s
        assert s.last_changed == 0 and s.identity, s


def test_a_permuted_copy_reports_the_sweep_that_found_it_and_a_cosine_of_one() -> None:
    """b = a with h1's units permuted (a true symmetry): the optimum is the inverse permutation, cosine 1,
    and some sweep (>= 1) changed h1's element."""
    a, _ = relu_mlp_pair()
    p = torch.tensor([3, 0, 5, 1, 4, 2])
    sd = a.state_dict()
    names = [n for n in sd if sd[n].ndim == 2]
    moved = dict(sd)
    moved[names[0]] = sd[names[0]][p]
    moved[names[0].replace("weight", "bias")] = sd[names[0].replace("weight", "bias")][p]
    moved[names[1]] = sd[names[1]][:, p]
    result = align(sd, moved, "mlp_relu", check=False)
    h1 = next(s for s in result.spaces if s.name == "h1")
    assert isinstance(h1.last_changed, int) and h1.last_changed >= 1 and not h1.identity, h1
    assert h1.after == pytest.approx(1.0, abs=1e-9) and h1.before < 0.999, h1
    for n in sd:
        assert torch.allclose(result.model[n], sd[n], atol=1e-12), n


def test_a_parameter_only_in_other_is_named() -> None:
    a, b = relu_mlp_pair()
    other = dict(b.state_dict(), extra=torch.zeros(2))
    with pytest.raises(AlignError, match=r"'extra' is only in other \(0 only in reference, 1 only in other\)"):
        align(a.state_dict(), other, "mlp_relu")


def test_an_inferred_spec_is_said_so_in_the_notes() -> None:
    """docs/align.md: with spec=None the spec is "inferred from the model and verified (symo infer)"; the
    result's notes say so (and, verified, every space is true: no check runs, none is relaxed)."""
    torch.manual_seed(0)
    a, b = MLP((4, 6, 6, 3), act="relu"), MLP((4, 6, 6, 3), act="relu")
    result = align(a, b)
    (note,) = result.notes
    assert note.startswith("spec inferred from the model and verified") and "(symo infer)" in note, note
    assert not result.relaxed


def test_the_timings_name_the_documented_stages() -> None:
    """AlignResult's docstring: `seconds` holds the stages run, in order, named spec, check, activations, match,
    apply, total; with spec=None no check runs and weight matching uses no activations."""
    torch.manual_seed(0)
    result = align(MLP((4, 6, 3)), MLP((4, 6, 3)))
    assert list(result.seconds) == ["spec", "match", "apply", "total"]
    assert all(v >= 0 for v in result.seconds.values())
    assert result.seconds["total"] >= result.seconds["match"] + result.seconds["apply"]


def test_inferring_from_state_dicts_says_what_to_pass() -> None:
    a, b = relu_mlp_pair()
    with pytest.raises(AlignError, match=r"with state dicts pass spec= \(a path, a bundled name or a Spec\)"):
        align(a.state_dict(), b.state_dict())


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise KeyError("no such input")


def test_a_model_that_cannot_run_names_the_exception_when_inferring() -> None:
    with pytest.raises(AlignError, match=r"\(KeyError: "):
        align(_Broken(), _Broken(), example_inputs=(torch.zeros(1, 3),))


# ------------------------------------------------ merging: the barrier's closed form, its modes, messages
def test_the_barrier_is_the_largest_rise_above_the_chord() -> None:
    """Closed form on a non-unit alpha range: the chord from (0, 1) to (2, 2) is 1.5 at alpha 1, so a
    loss of 3 there rises 1.5; an accuracy of 0.5 under the chord 0.8 drops 0.3 (higher is better)."""
    loss = BarrierResult([0.0, 1.0, 2.0], {"loss": [1.0, 3.0, 2.0]})
    assert loss.barrier("loss") == pytest.approx(1.5)
    acc = BarrierResult([0.0, 0.5, 1.0], {"acc": [0.9, 0.5, 0.7]})
    assert acc.barrier("acc") == pytest.approx(0.3)


def _mse(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return (model(batch) ** 2).mean()


def test_the_barrier_runs_both_repair_modes_and_repairing_a_with_its_own_statistics_keeps_it() -> None:
    """At alpha 0 the interpolated model is `a`; REPAIR with (a, b) as parents then sets a's units to a's
    own statistics, so the loss equals a's (evaluated directly here)."""
    a, b = relu_mlp_pair()
    torch.manual_seed(2)
    data = [torch.randn(16, 4, dtype=torch.float64) for _ in range(2)]
    with torch.no_grad():
        direct = float(sum(_mse(a, x) * len(x) for x in data) / sum(len(x) for x in data))
    for mode in ("reset", "repair"):
        result = barrier(a, b, _mse, data, alphas=[0.0, 1.0], repair_mode=mode, repair_data=data)
        assert result.values["loss"][0] == pytest.approx(direct, rel=1e-6), mode


def test_interpolate_names_the_side_that_is_not_a_model_and_what_differs() -> None:
    a, b = relu_mlp_pair()
    sa, sb = a.state_dict(), b.state_dict()
    with pytest.raises(AlignError, match=r"^b is not a model"):
        interpolate(sa, "b.pt", 0.5)
    extra = dict(sa, x=torch.zeros(1), y=torch.zeros(1))
    with pytest.raises(AlignError, match=r"only a has 'x', 'y'\)"):
        interpolate(extra, sb, 0.5)
    name = next(iter(sb))
    wide = dict(sb, **{name: torch.zeros(7, 4, dtype=torch.float64)})
    with pytest.raises(AlignError, match=r"in b; interpolate two models of the same architecture and width$"):
        interpolate(sa, wide, 0.5)
