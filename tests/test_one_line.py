"""`symo.Symo(model, preset=...)`: the one-line start picks the spec that trains best, says so, and a spec
whose blocks share one small statistic across thousands of coordinates warns at construction.

The model is symo.train.models_recurrence's small transformer (two pre-LayerNorm blocks of
`nn.MultiheadAttention` and a GELU MLP), trained on next-token prediction of a noisy recurrence (loss floor
0.565 nats on the predicted positions).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import symo
from symo.infer.inference import _on_device_of, default_example_inputs
from symo.optim import auto_spec
from symo.train import models
from symo.train.models_recurrence import TinyTransformer, train_recurrence

ADAMW_GRID = (3e-3, 1e-2, 3e-2)
train = train_recurrence  # seed 0: the run docs/infer.md reports


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_one_line_trains_as_well_as_tuned_adamw() -> None:
    adamw = {lr: train(lambda m, lr=lr: torch.optim.AdamW(m.parameters(), lr=lr)) for lr in ADAMW_GRID}
    best = min(adamw, key=adamw.get)
    assert best not in (ADAMW_GRID[0], ADAMW_GRID[-1]), f"AdamW's best rate is on the grid's edge: {adamw}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the spec it picks shares no small statistic: no warning
        symo_loss = train(lambda m: symo.Symo(m, preset="muon"))
    assert symo_loss <= 1.1 * adamw[best], (
        f"Symo(model, preset='muon') at the preset's lr: val {symo_loss:.4f}; AdamW {adamw} (best {adamw[best]:.4f}, "
        f"x{symo_loss / adamw[best]:.3f})")


def test_the_true_symmetry_spec_warns_naming_block_and_space() -> None:
    model = TinyTransformer()
    spec = symo.infer_spec(model)  # the true group: a residual-stream permutation 'res'
    with pytest.warns(UserWarning, match=r"block L\d+ 'std\(res\) x std\(fc\d\)': Y 1x2x4096.*"
                                         r"ratio width/mult = 2,048.*space that causes it: 'res' \(perm"):
        symo.Symo(model, spec, preset="muon")
    with pytest.warns(UserWarning, match=r"To train, pass the module itself, symo\.Symo\(model, \.\.\.\).*"
                                         r"symo infer --relax muon"):
        symo.Symo(model.named_parameters(), spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        symo.Symo(model, spec, preset="eigen_adam")  # a second moment per entry: not a normalised gradient
        symo.Symo(model, symo.infer_spec(model, relax="muon"), preset="muon")


@pytest.mark.parametrize("make", [models.gpt_small, models.gpt_bench])
def test_bundled_gpt_specs_do_not_warn(make) -> None:
    model = make()
    d_head = model.config.n_embd // model.config.n_head
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        symo.Symo(model, "gpt_muon", preset="muon")
        symo.Symo(model, "gpt_true", sizes={"dqk{i}": d_head, "dvo{i}": d_head})
        symo.Symo(model, preset="muon")
    with pytest.warns(UserWarning, match=r"'res' \(perm, size"):  # its inferred true group does
        symo.Symo(model, symo.infer_spec(model))


def test_bundled_muon_spec_does_not_warn_and_a_narrow_matrix_does() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        symo.Symo(models.mlp_tanh(), "muon")
    narrow = nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 2048), nn.Tanh(), nn.Linear(2048, 3))
    names = [n for n, _ in narrow.named_parameters()]
    assert names[2] == "2.weight"
    with pytest.warns(UserWarning, match=r"1 block shares one small statistic across at least 1,024 coordinates"
                                         r".*Y 1x2x2048.*It holds all of the entries of 1 parameter "
                                         r"\(2\.weight\).*Its space: '[^']+' \(signed_perm, size 2048.*"
                                         r"leave it out of the spec"):
        symo.Symo(narrow, preset="muon")  # Muon on a 2048 x 2 matrix: its 2 x 2 statistic, as Muon's own


def test_describe_names_the_chosen_spec_and_why() -> None:
    model = TinyTransformer()
    opt = symo.Symo(model, preset="muon")
    text = opt.describe()
    second = text.splitlines()[1]
    assert "'TinyTransformer (inferred, Muon relaxation)'" in text.splitlines()[0]
    assert second.strip().startswith("spec: the Muon-style relaxation inferred from the model")
    assert "trains best in our measurements" in text and "pass spec=... to choose" in text
    assert opt.spec_reason == auto_spec.REASON
    assert {g["lr"] for g in opt.param_groups if g["kind"] == "symo"} == {symo.PRESETS["muon"].lr}
    assert opt.assignment["blocks.0.attn.in_proj_weight"] == "symo" and opt.assignment["emb.weight"] == "adamw"
    given = symo.Symo(model, symo.infer_spec(model, relax="muon"), preset="muon")
    assert given.spec_reason is None and "spec: the Muon-style" not in given.describe()


def test_a_spec_is_needed_without_a_module_and_inputs_only_without_a_spec() -> None:
    model = TinyTransformer()
    with pytest.raises(TypeError, match=r"spec is missing.*pass the nn.Module itself"):
        symo.Symo(model.named_parameters())
    with pytest.raises(TypeError, match=r"example_inputs= is for inferring"):
        symo.Symo(model, "gpt_muon", example_inputs=torch.zeros(1, 4, dtype=torch.long))
    ids = torch.zeros(2, 5, dtype=torch.long)
    assert symo.Symo(model, example_inputs=ids).compiled.param_names  # given inputs: the same spec

    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.c(torch.tanh(self.b(torch.tanh(self.a(x))))) * scale

    with pytest.raises(RuntimeError, match=r"could not infer a spec from TwoInputs.*Pass example_inputs="):
        symo.Symo(TwoInputs())
    opt = symo.Symo(TwoInputs(), example_inputs=(torch.randn(2, 4), torch.ones(1)))
    assert opt.assignment["b.weight"] == "symo" and opt.assignment["a.weight"] == "adamw"


def test_infer_report_says_which_spec_serves_what() -> None:
    model = TinyTransformer()
    true_text = symo.infer.infer(model).report().splitlines()
    muon_text = symo.infer.infer(model, relax="muon").report().splitlines()
    assert true_text[1].startswith("use: the curvature and alignment tools")
    assert "For training use the Muon-style relaxation" in " ".join(true_text[1:5])
    assert muon_text[1].startswith("use: training. This is the Muon-style relaxation")
    assert symo.infer.training_spec(model) == symo.infer_spec(model, relax="muon")


def test_guessed_inputs_are_made_on_the_model_device() -> None:
    """Symo(model) on a model already moved to a GPU traces it with inputs on that device (meta stands in)."""
    model = TinyTransformer().to("meta")
    args, kwargs = _on_device_of(model, default_example_inputs(model))
    assert [a.device.type for a in args] == ["meta"] and not kwargs
    assert symo.infer.training_spec(model) == symo.infer_spec(TinyTransformer(), relax="muon")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_guessed_inputs_take_the_first_layers_dtype(dtype: torch.dtype) -> None:
    """align(a, b) and Symo(model) with no example inputs on a float64 (or bfloat16) model: the guessed batch is in
    the model's dtype, so the trace runs (float32 inputs fail in the first Linear)."""
    from symo.train.models import MLP

    torch.manual_seed(0)
    a, b = MLP((4, 6, 3)).to(dtype), MLP((4, 6, 3)).to(dtype)
    (x,), _ = default_example_inputs(a)
    assert x.dtype == dtype
    a(x)  # the model runs on what was guessed
    if dtype == torch.float64:
        result = symo.align(a, b)
        assert result.objective_after >= result.objective_before
