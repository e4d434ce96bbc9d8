"""Activation matching's edges the other alignment tests leave open (found by mutation testing,
scripts/mutation.sh), each checked against an independent oracle: the correlation statistics (numpy's corrcoef),
the documented messages for inputs it cannot read, the training modes it leaves as they were, repair's hidden-unit
statistics, the barrier plot, and where each space's activations are read."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cases import MLP2_SPEC, relu_mlp_pair
from torch import nn

import symo
import symo.alignment.alignment as alignment_module
from symo.alignment import AlignError, AlignWarning, align, interpolate, repair
from symo.alignment.activations import Site, _argument, _projection, _Stats, locate, model_inputs
from symo.alignment.merge import BarrierResult, evaluate
from symo.train.models import MLP


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
    a, b = relu_mlp_pair()
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
    a, b = relu_mlp_pair()
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
