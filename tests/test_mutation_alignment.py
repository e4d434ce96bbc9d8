"""The alignment room's edges the other alignment tests leave open (found by mutation testing,
scripts/mutation.sh), each checked against an independent oracle: the report's documented columns and
phrases (docs/align.md, `AlignResult.report`'s docstring) and the per-group element forms documented on
`AlignResult.elements`, built here from known permutations, signs and rotations."""

from __future__ import annotations

import copy
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cases import MLP2_SPEC
from torch import nn

import symo
import symo.alignment.alignment as alignment_module
from symo.alignment import AlignError, AlignWarning, align, barrier, interpolate, repair
from symo.alignment.activations import Site, _argument, _projection, _Stats, locate, model_inputs
from symo.alignment.merge import BarrierResult, evaluate
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
def _mlps(seed: int = 1) -> tuple[MLP, MLP]:
    torch.manual_seed(0)
    a = MLP((4, 6, 6, 3), act="relu").double()
    torch.manual_seed(seed)
    return a, MLP((4, 6, 6, 3), act="relu").double()


def test_the_sweep_limit_message_names_the_cli_flag() -> None:
    """docs/align.md documents the flag as `--max-sweeps`."""
    a, b = _mlps()
    with pytest.raises(AlignError, match=r"max_sweeps must be an integer >= 1 \(CLI: --max-sweeps\), got 0"):
        align(a, b, "mlp_relu", max_sweeps=0)


def test_a_state_dict_on_either_side_is_not_checked_and_says_so() -> None:
    """The symmetry check runs the models: with a state dict on either side there is none to run."""
    a, b = _mlps()
    for ref, other in ((a, b.state_dict()), (a.state_dict(), b), (a.state_dict(), b.state_dict())):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AlignWarning)
            result = align(ref, other, "mlp_relu")
        unchecked = [n for n in result.notes if n.startswith("symmetry not checked")]
        assert len(unchecked) == 1 and unchecked[0].startswith("symmetry not checked (state dicts"), result.notes
        assert not result.relaxed


def test_a_model_aligned_to_itself_reports_cosines_of_one() -> None:
    """<W, W> / (|W| |W|) = 1 for every space, before and after (the identity is optimal)."""
    a, _ = _mlps()
    result = align(a, copy.deepcopy(a), "mlp_relu", check=False)
    for s in result.spaces:
        assert s.before == pytest.approx(1.0, abs=1e-9) and s.after == pytest.approx(1.0, abs=1e-9), s
        assert s.last_changed == 0 and s.identity, s


def test_a_permuted_copy_reports_the_sweep_that_found_it_and_a_cosine_of_one() -> None:
    """b = a with h1's units permuted (a true symmetry): the optimum is the inverse permutation, cosine 1,
    and some sweep (>= 1) changed h1's element."""
    a, _ = _mlps()
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
    a, b = _mlps()
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
    a, b = _mlps()
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
    a, b = _mlps()
    torch.manual_seed(2)
    data = [torch.randn(16, 4, dtype=torch.float64) for _ in range(2)]
    with torch.no_grad():
        direct = float(sum(_mse(a, x) * len(x) for x in data) / sum(len(x) for x in data))
    for mode in ("reset", "repair"):
        result = barrier(a, b, _mse, data, alphas=[0.0, 1.0], repair_mode=mode, repair_data=data)
        assert result.values["loss"][0] == pytest.approx(direct, rel=1e-6), mode


def test_interpolate_names_the_side_that_is_not_a_model_and_what_differs() -> None:
    a, b = _mlps()
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


# ------------------------------------------------ activation matching: the statistics and the messages
def test_the_activation_statistics_are_pearson_correlations_over_two_batches() -> None:
    """`_Stats.matrix("perm")` is the cross-correlation of the two models' units, per copy: numpy's corrcoef
    of the concatenated batches is the oracle."""
    g = torch.Generator().manual_seed(0)
    r = torch.randn(10, 2, 3, generator=g, dtype=torch.float64)
    o = torch.randn(10, 2, 3, generator=g, dtype=torch.float64) * 3 + r
    stats = _Stats()
    stats.add(r[:4], o[:4])
    stats.add(r[4:], o[4:])
    got = stats.matrix("perm")
    for c in range(2):
        full = np.corrcoef(r[:, c].numpy().T, o[:, c].numpy().T)
        np.testing.assert_allclose(got[c].numpy(), full[:3, 3:], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match=r"differ in shape: \(10, 2, 3\) vs \(10, 2, 4\)$"):
        _Stats().add(r, torch.zeros(10, 2, 4, dtype=torch.float64))


def test_a_batch_that_is_no_input_is_refused_with_the_documented_message() -> None:
    """`model_inputs`' docstring: a tensor, a dict, or a non-empty tuple or list."""
    for batch in (3, ()):
        with pytest.raises(TypeError, match=r"^a data batch must be a tensor, a dict of keyword inputs, or "):
            model_inputs(batch)


def test_activation_matching_without_a_batch_says_so() -> None:
    a, b = _mlps()
    with pytest.raises((AlignError, ValueError), match="data holds no batch"):
        align(a, b, "mlp_relu", method="activations", data=[], check=False)


def test_an_input_that_cannot_be_read_says_which_and_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"reads a module's input 1, but it was called with 0 positional arguments "
                                         r"and the keywords \['query'\]; use method='weights'"):
        _argument((), {"query": torch.zeros(1)}, 1)


def test_the_relaxed_warning_names_up_to_six_spaces_and_points_at_the_caller() -> None:
    """The muon spec gives each layer of an MLP a private row space, none a true symmetry: 6 layers are all
    named, a 7th is elided; the warning is attributed to the caller of `align` (stacklevel), not to align."""
    for hidden in (5, 6):
        torch.manual_seed(0)
        a, b = (MLP((4,) + (5,) * hidden + (3,), act="tanh").double() for _ in range(2))
        with pytest.warns(AlignWarning) as record:
            result = align(a, b, "muon")
        rows = [f"rows{i}" for i in range(1, hidden + 2)]
        assert result.relaxed == rows
        listed = ", ".join(rows) if hidden == 5 else ", ".join(rows[:6]) + ", ..."
        assert f"space(s) are not true symmetries of the model ({listed}): the aligned" in str(record[0].message)
        # the caller: this file (mutmut's trampoline when it runs the tests), never the module that warns
        assert record[0].filename != alignment_module.__file__
        assert record[0].filename == __file__ or record[0].filename.endswith("trampoline.py")


def test_activation_matching_leaves_each_modules_training_mode_as_it_was() -> None:
    """It runs the models in eval mode and restores every module's own mode afterwards (a mixed one too)."""
    a, b = _mlps()
    a.train()
    b.train()
    first = next(m for m in b.modules() if isinstance(m, nn.Linear))
    first.eval()
    before = {name: m.training for model in (a, b) for name, m in model.named_modules()}
    torch.manual_seed(3)
    align(a, b, "mlp_relu", method="activations", data=[torch.randn(8, 4, dtype=torch.float64)], check=False)
    after = {name: m.training for model in (a, b) for name, m in model.named_modules()}
    assert {n: type(v) for n, v in after.items()} == {n: bool for n in before}
    assert [m.training for m in a.modules()] == [True] * len(list(a.modules()))
    assert [m.training for m in b.modules()] == [m is not first for m in b.modules()]


def test_repair_sets_the_hidden_units_statistics_of_a_sequence_model_to_the_parents_blend() -> None:
    """REPAIR's contract on a Linear applied along a sequence (units on the last axis, statistics over the
    batch and the positions, a one-sample batch among them): the repaired midpoint's hidden units have
    the mean and standard deviation halfway between a's and b's, computed here from the outputs."""
    def net() -> nn.Sequential:
        return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()

    torch.manual_seed(0)
    a, b = net(), net()
    data = [torch.randn(7, 5, 4, dtype=torch.float64), torch.randn(1, 1, 4, dtype=torch.float64)]

    def stats(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            h = torch.cat([model[0](x).reshape(-1, 6) for x in data])
        return h.mean(0), h.std(0, unbiased=False)

    fixed = repair(interpolate(a, b, 0.5), data, parents=(a, b), alpha=0.5)
    (ma, sa), (mb, sb), (mf, sf) = stats(a), stats(b), stats(fixed)
    torch.testing.assert_close(mf, (ma + mb) / 2, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(sf, (sa + sb) / 2, rtol=1e-9, atol=1e-9)


def test_evaluate_weights_dict_batches_by_their_size() -> None:
    """A dict batch (keyword inputs) counts by its first input's first dimension: the mean over a batch of
    3 rows with loss 1 and one of 1 row with loss 5 is (3 + 5) / 4 = 2."""
    model = nn.Linear(2, 1)
    batches = [{"input": torch.zeros(3, 2)}, {"input": torch.zeros(1, 2)}]
    assert evaluate(model, lambda m, batch: 1.0 if len(batch["input"]) == 3 else 5.0, batches) == {"loss": 2.0}


def test_repair_without_a_bias_says_what_it_needs() -> None:
    torch.manual_seed(0)
    a, b = (nn.Sequential(nn.Linear(4, 6, bias=False), nn.ReLU(), nn.Linear(6, 3)) for _ in range(2))
    with pytest.raises(AlignError, match=r"REPAIR needs layers with a bias \(or BatchNorm layers\)"):
        repair(interpolate(a, b, 0.5), [torch.randn(5, 4)], parents=(a, b))


class _BrokenMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise KeyError("no such input")


def test_a_model_the_check_cannot_run_is_aligned_with_a_note_on_which_inputs_failed() -> None:
    """The check runs the model on guessed inputs, or on the given ones: the note says which."""
    for given, word in ((None, "guessed"), ((torch.zeros(2, 4),), "given")):
        torch.manual_seed(0)
        a, b = _BrokenMLP((4, 6, 6, 3)), _BrokenMLP((4, 6, 6, 3))
        result = align(a, b, "mlp_relu", example_inputs=given)
        assert any(n.startswith(f"symmetry not checked: the model did not run on the {word} example inputs "
                                "(KeyError: ") for n in result.notes), result.notes


def test_the_barrier_plot_draws_the_values_against_alpha_with_the_label(tmp_path, monkeypatch) -> None:
    """`BarrierResult.plot`: `name` against alpha (x: the alphas, y: the values, the y axis named `name`),
    one line labelled `label`, written to `path`; the figure is read back before it is closed."""
    plt = pytest.importorskip("matplotlib.pyplot")
    seen = []
    monkeypatch.setattr(plt, "close", lambda fig: seen.append(fig))
    result = BarrierResult([0.0, 0.25, 1.0], {"loss": [1.0, 3.0, 2.0]})
    path = result.plot(tmp_path / "path.png", label="aligned")
    assert path == tmp_path / "path.png" and path.stat().st_size > 0
    (ax,) = seen[0].axes
    (line,) = ax.lines
    assert list(line.get_xdata()) == [0.0, 0.25, 1.0] and list(line.get_ydata()) == [1.0, 3.0, 2.0]
    assert ax.get_ylabel() == "loss" and [t.get_text() for t in ax.get_legend().get_texts()] == ["aligned"]


# ------------------------------------------------ activation matching: where each space is found
_MLP_SPEC = MLP2_SPEC.format(h1="perm", h2="identity")  # h2 kept in place


def test_a_hidden_space_is_found_at_the_input_of_the_layer_that_reads_it_only() -> None:
    """activations.py's docstring: a space is found at the *input* of a Linear whose weight's input axis holds
    it (fc2 reads h1, after the ReLU), the output of one (fc1, before it) only where there is no input."""
    model = MLP((4, 6, 6, 3), act="relu")
    sites = locate(model, symo.compile("mlp_relu", model))
    assert {s: [(x.module, x.side) for x in xs] for s, xs in sites.items()} == {
        "h1": [("fc2", "input")], "h2": [("fc3", "input")]}


def test_an_identity_space_is_not_located() -> None:
    """A site holds a *moving* space (`_site`'s docstring): h2's group is the identity, it has none, though
    fc3 reads it on its own."""
    model = MLP((4, 6, 6, 3), act="relu")
    sites = locate(model, symo.compile(symo.parse_spec(_MLP_SPEC), model))
    assert set(sites) == {"h1"} and [(x.module, x.side) for x in sites["h1"]] == [("fc2", "input")]


def test_the_attention_projection_is_computed_from_the_thirds_the_site_touches() -> None:
    """`_projection`'s docstring, against F.linear on in_proj_weight's rows [q | k | v], each third applied to
    its own input (query, key, value differ here): a slice within v gives v alone, starting at 2e; one over
    k and v's first row gives k and v side by side (the feature axis), starting at e."""
    e = 4
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(e, 2, batch_first=True).double()
    q, k, v = (torch.randn(3, 5, e, dtype=torch.float64) for _ in range(3))
    w, b = attn.in_proj_weight, attn.in_proj_bias
    third = {j: F.linear(x, w[j * e:(j + 1) * e], b[j * e:(j + 1) * e]) for j, x in enumerate((q, k, v))}

    def site(start: int, length: int) -> Site:
        return Site("attn", "projection", -1, start, length, (length,), 0, None)

    t, offset = _projection(attn, (q, k, v), {}, site(2 * e, e))
    assert offset == 2 * e and torch.equal(t, third[2])
    t, offset = _projection(attn, (), {"query": q, "key": k, "value": v}, site(e, e + 1))
    assert offset == e and t.shape == (3, 5, 2 * e) and torch.equal(t, torch.cat([third[1], third[2]], -1))
    t, offset = _projection(attn, (q, k, v), {}, site(0, 3 * e))
    assert offset == 0 and torch.equal(t, torch.cat([third[0], third[1], third[2]], -1))
