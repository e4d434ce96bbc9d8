"""Symo's API around the update: reports, validation, parameter lists, state, the built-in AdamW.

Companion of tests/test_optim_options.py and tests/test_optim_backends.py (which hold the update itself against
references); each test here checks one behaviour against a hand-computed value or a documented message.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from cases import MUON, SIZES, SPECS, TANH, mlp_data, mse_loss
from symo.compiler import parse_spec

import symo
from symo.optim import Symo
from symo.runtime.compiled import NonFiniteGradientError
from symo.train.models import MLP


def test_check_finite_false_skips_the_check():
    """check_finite=False: finite steps are unchanged, and a NaN gradient raises nothing and reaches the
    weights (Newton–Schulz backend: eigh itself rejects NaN input); with True the same step raises."""
    torch.manual_seed(0)
    base = MLP(SIZES).double()
    x, y = mlp_data()
    runs = []
    for check in (True, False):
        model = copy.deepcopy(base)
        opt = Symo(model.named_parameters(), MUON, lr=0.01, check_finite=check, backend="newton_schulz")
        for _ in range(2):
            opt.zero_grad()
            mse_loss(model, x, y).backward()
            opt.step()
        opt.zero_grad()
        mse_loss(model, x, y).backward()
        model.fc2.weight.grad[0, 0] = float("nan")
        runs.append((model, opt))
    for a, b in zip(runs[0][0].parameters(), runs[1][0].parameters()):
        assert torch.equal(a, b)
    with pytest.raises(NonFiniteGradientError, match="fc2.weight"):
        runs[0][1].step()
    model, opt = runs[1]
    opt.step()
    assert torch.isnan(model.fc2.weight).all() and not torch.isnan(model.fc1.weight).any()


def test_memory_report_counts_by_hand():
    """MLP (8, 16, 12, 4) with biases, muon.toml: weights covered (128 + 192 + 48), biases to AdamW (32)."""
    model = MLP((8, 16, 12, 4))
    covered, biases = 16 * 8 + 12 * 16 + 4 * 12, 16 + 12 + 4
    shampoo = (16 ** 2 + 8 ** 2) + (12 ** 2 + 16 ** 2) + (4 ** 2 + 12 ** 2) + 2 * biases
    fast = Symo(model.named_parameters(), MUON).memory_report()
    assert fast == {"symo": covered + 2 * biases, "symo_block_statistics": 0,
                    "adamw": 2 * (covered + biases), "shampoo": shampoo}
    # stored statistics: an EMA and its matrix function per block, mult x mult with mult = columns
    stats = 2 * (8 ** 2 + 16 ** 2 + 12 ** 2)
    stored = Symo(model.named_parameters(), MUON, preconditioner="root", beta2=0.9).memory_report()
    assert stored == {"symo": covered + stats + 2 * biases, "symo_block_statistics": stats,
                      "adamw": 2 * (covered + biases), "shampoo": shampoo}
    assert Symo(model.named_parameters(), MUON, preconditioner="root",
                precondition_frequency=2).memory_report()["symo_block_statistics"] \
        == stats


def test_memory_report_matches_the_state_it_keeps():
    """After a step, the state tensors hold exactly the reported numbers (besides AdamW's step counters)."""
    torch.manual_seed(0)
    model = MLP((8, 16, 12, 4)).double()
    x = torch.randn(4, 8, dtype=torch.float64)
    for options in ({}, {"preconditioner": "root", "beta2": 0.9}):
        opt = Symo(model.named_parameters(), MUON, **options)
        model(x).square().sum().backward()
        opt.step()
        counters = sum(1 for st in opt.state.values() if "exp_avg" in st)
        assert opt.state_bytes() == 8 * opt.memory_report()["symo"] + 4 * counters, options
        model.zero_grad()


def test_add_param_group_after_construction_is_rejected():
    model = MLP((8, 16, 12, 4))
    opt = Symo(model.named_parameters(), MUON)
    groups = len(opt.param_groups)
    with pytest.raises(NotImplementedError, match="create a new optimizer"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert len(opt.param_groups) == groups


def test_describe_reports_every_option_and_block():
    model = MLP(SIZES).double()
    opt = Symo(model.named_parameters(), MUON, preconditioner="taylor", lr=0.1, beta1=0.9, nesterov=False, beta2=0.5,
               statistic="gradient", power=-0.25, damping=1e-3, damping_mode="absolute", update_scale="adamw",
               precondition_frequency=3)
    text = opt.describe()
    assert text.splitlines()[0] == ("Symo: 3 parameters preconditioned by spec 'Muon (per-matrix rows)', "
                                    "3 to AdamW")
    options = " ".join(ln.strip() for ln in text.splitlines()[1:4])  # the option lines wrap at 120 columns
    assert options.startswith(
        "preconditioner 'taylor': power=-0.25 damping=0.001 damping_mode='absolute' statistic='gradient' "
        "stats_dtype='auto' beta2=0.5 precondition_frequency=3 max_precond_dim=2048 beta1=0.9 nesterov=False "
        "update_scale=adamw statistics=float64"), options
    blocks = [ln for ln in text.splitlines() if ln.startswith("  L")]
    assert len(blocks) == 3 and blocks[1].startswith("  L1 nat(rows2)")
    # update_scale="adamw": every block's unit update has RMS adamw_rms (0.2), so lr_eff = 0.1 * 0.2
    assert blocks[1].endswith(": Y 1x8x6, d=6, lr_eff=0.02, backend=eigh; fc2.weight"), blocks[1]
    # no adamw_lr: the AdamW side follows lr (AdamW's scale documents 3e-3, so 1 x lr)
    assert text.splitlines()[-1] == ("  AdamW: fc1.bias, fc2.bias, fc3.bias at its own rate 0.1 (adamw_lr=None: 1 x "
                                     "lr, 0.003 at the documented rate 0.003)")
    bias_free = MLP(SIZES, bias=False)
    assert Symo(bias_free.named_parameters(), MUON).describe().splitlines()[-1] == "  AdamW: (none)"


ROOT = {"preconditioner": "root"}


@pytest.mark.parametrize("bad,start", [
    ({"beta1": 1.0}, "beta1"), ({"beta1": -0.1}, "beta1"), ({**ROOT, "beta2": 1.01}, "beta2"),
    ({**ROOT, "beta2": -0.1}, "beta2"), ({"statistic": "grad"}, "statistic"), ({"damping": -1e-9}, "damping"),
    ({"damping_mode": "rel"}, "damping_mode"), ({"preconditioner": "fisher"}, "preconditioner"),
    ({"power": 0.0}, "power"), ({**ROOT, "precondition_frequency": 0}, "precondition_frequency"),
    ({"update_scale": "sgd"}, "update_scale"), ({"backend": "svd"}, "backend"),
    ({"backend": "newton_schulz", "power": -0.25}, "the newton_schulz backend"),
    ({**ROOT, "backend": "newton_schulz", "geometric_mean_with": "shampoo_cols"}, "the newton_schulz backend"),
    ({"preconditioner": "published", "update_scale": "muon"}, "update_scale='muon' has no meaning"),
])
def test_invalid_options_are_rejected_by_name(bad, start):
    """The message starts with the option's name (so a garbled or re-cased message fails too)."""
    model = MLP(SIZES)
    with pytest.raises(ValueError, match="^" + start):
        Symo(model.named_parameters(), MUON, **bad)


def test_boundary_options_are_accepted():
    model = MLP(SIZES)
    for good in ({"beta1": 0.0}, {**ROOT, "beta2": 0.0}, {**ROOT, "beta2": 1.0}, {"damping": 0.0}, {"power": -1e-9},
                 {**ROOT, "precondition_frequency": 1}, {"backend": "newton_schulz", "power": -0.5}):
        Symo(model.named_parameters(), MUON, **good)


def test_parameter_list_errors():
    model = MLP(SIZES)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="^Symo got an empty parameter list$"):
        Symo([], MUON)
    with pytest.raises(TypeError, match="^Symo needs named parameters: pass model.named_parameters()"):
        Symo(model.parameters(), MUON)
    with pytest.raises(TypeError, match="mix"):
        Symo([{"params": named[:2]}, named[2]], MUON)
    with pytest.raises(ValueError, match="'fc1.weight' given twice"):
        Symo([{"params": named}, {"params": named[:1]}], MUON)
    with pytest.raises(ValueError, match="unknown param-group option"):
        Symo([{"params": named, "estimator": "taylor"}], MUON)
    with pytest.raises(ValueError, match=r"parameters 'fc1.weight' and 'tied.weight' are one tensor \(tied"):
        Symo(named + [("tied.weight", named[0][1])], MUON)
    with pytest.raises(symo.SpecError, match=r"(?s)every parameter name starts with '_orig_mod.'.*model._orig_mod"
                                             r".named_parameters\(\)"):
        Symo([(f"_orig_mod.{n}", p) for n, p in named], MUON)  # torch.compile's wrapper's names
    compiled = Symo(torch.compile(model), MUON)  # the wrapper is unwrapped: the model's own names, same tensors
    assert compiled.param_groups[0]["param_names"] == ["fc1.weight", "fc2.weight", "fc3.weight"]
    assert compiled.param_groups[0]["params"][0] is model.fc1.weight
    # a {name: param} dict, and groups holding dicts, are named parameters too
    opt = Symo(dict(named), MUON, lr=0.3)
    assert opt.param_groups[0]["param_names"] == ["fc1.weight", "fc2.weight", "fc3.weight"]
    # no adamw_lr: the AdamW side follows lr, 3e-3 at the default 1e-3
    assert opt.param_groups[0]["lr"] == 0.3 and opt.param_groups[1]["lr"] == pytest.approx(0.9)
    opt = Symo([{"params": dict(named[:3]), "lr": 0.5, "adamw_lr": 0.05}, {"params": dict(named[3:])}], MUON, lr=0.3)
    assert [(g["kind"], g["lr"]) for g in opt.param_groups] == [("symo", 0.5), ("adamw", 0.05), ("symo", 0.3),
                                                               ("adamw", pytest.approx(0.9))]


def test_compiled_spec_and_geometric_mean_coverage_errors():
    import symo

    model = MLP(SIZES)
    other = symo.compile(MUON, MLP((5, 9, 6, 3)), disk_cache=False)
    with pytest.raises(ValueError, match="compiled for other shapes"):
        Symo(model.named_parameters(), other)
    same = symo.compile(MUON, model, disk_cache=False)
    assert Symo(model.named_parameters(), same).compiled is same
    with pytest.raises(ValueError, match=r"not given to the optimizer: \['fc1.weight'\]"):
        Symo(list(model.named_parameters())[2:], same)
    with pytest.raises(ValueError, match="both specs must cover the same parameters"):
        Symo(model.named_parameters(), MUON, preconditioner="root", geometric_mean_with=TANH)


def test_blocks_without_gradients_keep_no_statistics():
    """Stored-statistics path: a block none of whose parameters has a gradient is skipped (no EMA, no step)
    and its parameters do not move; when it gets gradients, its statistics start from step 1."""
    torch.manual_seed(0)
    model = MLP(SIZES).double()
    opt = Symo(model.named_parameters(), TANH, preconditioner="root", lr=0.05, beta2=0.9)
    x, _ = mlp_data()
    fc3 = model.fc3.weight.detach().clone()
    for _ in range(2):
        opt.zero_grad()
        torch.tanh(model.fc2(torch.tanh(model.fc1(x)))).square().sum().backward()   # fc3 unused
        opt.step()
    blocks = {b.id: b.params for b in opt.compiled.blocks}
    state = opt.block_statistics()
    assert torch.equal(model.fc3.weight, fc3)
    assert all(state[b]["step"] == 2 for b, ps in blocks.items() if "fc1.weight" in ps)
    assert not any(b in state for b, ps in blocks.items() if set(ps) <= {"fc3.bias"})
    opt.zero_grad()
    model(x).square().sum().backward()
    opt.step()
    state = opt.block_statistics()  # a snapshot: read again after the step
    assert all(state[b]["step"] == 1 for b, ps in blocks.items() if set(ps) <= {"fc3.bias"})


def test_loaded_state_is_owned_by_the_optimizer():
    """load_state_dict copies: two optimizers loaded from one state dict train independently of it and of
    each other, bit for bit equal (stored statistics, momentum, AdamW moments)."""
    torch.manual_seed(0)
    base = MLP(SIZES).double()
    x, y = mlp_data()
    opt = Symo(base.named_parameters(), MUON, preconditioner="root", lr=0.01, beta2=0.9, precondition_frequency=2)
    for _ in range(3):
        opt.zero_grad()
        mse_loss(base, x, y).backward()
        opt.step()
    saved = opt.state_dict()
    frozen = copy.deepcopy(saved)
    twins = []
    for _ in range(2):
        model = copy.deepcopy(base)
        o = Symo(model.named_parameters(), MUON, preconditioner="root", lr=0.01, beta2=0.9, precondition_frequency=2)
        o.load_state_dict(saved)
        twins.append((model, o))
    for model, o in twins:
        for _ in range(3):
            o.zero_grad()
            mse_loss(model, x, y).backward()
            o.step()
    for a, b in zip(twins[0][0].parameters(), twins[1][0].parameters()):
        assert torch.equal(a, b)
    for k, v in frozen["state"].items():
        for name, t in v.items():
            if torch.is_tensor(t):
                assert torch.equal(saved["state"][k][name], t), (k, name)


def test_adamw_on_bfloat16_parameters_by_hand():
    """Uncovered bfloat16 parameters: moments in float32, one step p - lr m_hat / (sqrt(v_hat) + eps) with
    decoupled weight decay, rounded to bfloat16 once."""
    torch.manual_seed(0)
    model = MLP(SIZES).to(torch.bfloat16)
    x, y = mlp_data()
    opt = Symo(model.named_parameters(), MUON, lr=0.01, adamw_lr=0.1, adamw_betas=(0.8, 0.9), adamw_eps=1e-3,
               adamw_wd=0.5)
    mse_loss(model, x.bfloat16(), y.bfloat16()).backward()
    b0, g = model.fc1.bias.detach().clone(), model.fc1.bias.grad.float()
    opt.step()
    m_hat, v_hat = 0.2 * g / 0.2, 0.1 * g * g / 0.1
    want = (b0 * (1 - 0.1 * 0.5)) - (0.1 * m_hat / (v_hat.sqrt() + 1e-3)).to(torch.bfloat16)
    assert opt.state[model.fc1.bias]["exp_avg"].dtype == torch.float32
    assert torch.equal(model.fc1.bias.detach(), want)


def test_checkpoint_format_names_each_stage():
    """The block statistics sit in the state dict on their component's anchor parameter (the first that
    requires a gradient: parameter-keyed, so torch.distributed.checkpoint saves them), under "symo_blocks"
    and, with a geometric mean, the second spec's under "symo_gm_blocks"; a checkpoint of the earlier
    layout, with both under string keys of the state itself, still loads and continues bit for bit."""
    torch.manual_seed(0)
    model = MLP(SIZES, bias=False).double()
    twin = copy.deepcopy(model)
    make = lambda m: Symo(m.named_parameters(), SPECS / "shampoo_rows.toml", preconditioner="root", beta2=0.9,  # noqa: E731
                          geometric_mean_with=SPECS / "shampoo_cols.toml")
    opt = make(model)
    x = torch.randn(4, SIZES[0], dtype=torch.float64)
    model(x).square().sum().backward()
    opt.step()
    saved = opt.state_dict()
    state = saved["state"]
    assert not {"symo_blocks", "symo_gm_blocks"} & set(state)
    stages = {key: {b: st for v in state.values() for b, st in v.get(key, {}).items()}
              for key in ("symo_blocks", "symo_gm_blocks")}
    assert len(stages["symo_blocks"]) == len(stages["symo_gm_blocks"]) == 3
    assert all(set(st) == {"step", "ema", "precond"} for st in stages["symo_gm_blocks"].values())
    # the earlier layout: the same statistics under string keys
    earlier = {**saved, "state": {**{i: {k: v for k, v in st.items() if k not in stages} for i, st in state.items()},
                                  **stages}}
    again = make(twin)
    twin.load_state_dict(model.state_dict())
    again.load_state_dict(earlier)
    for m, o in ((model, opt), (twin, again)):
        o.zero_grad()
        m(x).square().sum().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_strict_false_preconditions_a_subset_with_the_full_spec(tmp_path: Path):
    """Fine-tuning part of a model: the whole model's spec, only fc3's parameters given. strict=True refuses
    (saying how to fix it); strict=False drops the absent parameters' entries and steps the rest; the default
    does the same with a warning."""
    from symo import SpecError

    model = MLP((6, 10, 8, 4))
    tanh = Path(__file__).resolve().parent.parent / "specs" / "mlp_tanh.toml"
    subset = {n: p for n, p in model.named_parameters() if n.startswith("fc3")}
    with pytest.raises(SpecError, match="strict=False"):
        Symo(subset, tanh, strict=True)
    with pytest.warns(UserWarning, match="mlp_tanh.toml: the spec's rule params.'fc1.weight' matches no parameter "
                                         "given to Symo"):
        Symo(subset, tanh)
    misspelt = tmp_path / "misspelt.toml"
    misspelt.write_text(tanh.read_text().replace('"fc2.weight"', '"fc2.wieght"'))
    with pytest.warns(UserWarning, match=r"misspelt.toml: the spec's rule params.'fc2.wieght' matches no parameter "
                                         r"given to Symo \(check the name; parameters that look similar: "
                                         r"\['fc2.weight'"):
        Symo(model, misspelt)
    opt = Symo(subset, tanh, strict=False, lr=0.01)
    assert set(opt.compiled.param_names) <= set(subset) and opt.compiled.param_names
    before = model.fc3.weight.detach().clone()
    model(torch.randn(5, 6)).pow(2).mean().backward()
    opt.step()
    assert not torch.equal(model.fc3.weight, before) and model.fc1.weight.grad is not None


def test_groups_as_torch_users_write_them():
    """beta1 per group under Muon's step (momentum per parameter); refused at construction under a kind that
    debiases it over blocks; a group's weight_decay reaches its AdamW half (the nanoGPT decay / no-decay
    pattern); OneCycleLR with cycle_momentum=False scales both halves."""
    torch.manual_seed(0)
    model = MLP(SIZES)
    named = list(model.named_parameters())
    matrices = [(n, p) for n, p in named if p.dim() == 2]
    vectors = [(n, p) for n, p in named if p.dim() < 2]
    x, y = (t.float() for t in mlp_data())
    opt = Symo([{"params": matrices[:1], "beta1": 0.9}, {"params": matrices[1:], "beta1": 0.5}, {"params": vectors}],
               MUON, lr=0.01)
    for _ in range(2):
        opt.zero_grad()
        mse_loss(model, x, y).backward()
        opt.step()
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    with pytest.raises(ValueError, match=r"different beta1 values \[0.5, 0.9\]; the eigen_adam kind divides"):
        Symo([{"params": matrices[:1], "beta1": 0.9}, {"params": matrices[1:] + vectors, "beta1": 0.5}], MUON,
             preset="soap")
    middle = parse_spec('[spaces]\nr = "signed_perm"\n[params]\n"fc2.weight" = ["r", "_"]\n')  # fc1, fc3: AdamW
    decayed = Symo([{"params": matrices, "weight_decay": 0.1}, {"params": vectors, "weight_decay": 0.0}], middle)
    by_group = {(g["kind"], g["user_group"]): g["weight_decay"] for g in decayed.param_groups}
    assert by_group == {("symo", 0): 0.1, ("adamw", 0): 0.1, ("adamw", 1): 0.0}
    own = Symo([{"params": named, "weight_decay": 0.1, "adamw_wd": 0.01}], MUON)
    assert {g["kind"]: g["weight_decay"] for g in own.param_groups} == {"symo": 0.1, "adamw": 0.01}
    mixed = Symo([{"params": named, "weight_decay": 0.1}], MUON)
    assert {g["kind"]: g["weight_decay"] for g in mixed.param_groups} == {"symo": 0.1, "adamw": 0.1}
    schedule = torch.optim.lr_scheduler.OneCycleLR(mixed, max_lr=0.05, total_steps=4, cycle_momentum=False)
    before = [g["lr"] for g in mixed.param_groups]
    mixed.step()
    schedule.step()
    assert all(g["lr"] != b for g, b in zip(mixed.param_groups, before))
