"""Symo's and SymoConfig's validation: every message checked whole (a garbled or emptied message fails), the
boundary values accepted, and the options that only shape construction (defaults, `config`, `sizes`).
Mutation testing (scripts/mutation.sh) found each of these unchecked by the optimizer's tests.
"""

from __future__ import annotations

import re

import pytest
import torch
from cases import MUON, SIZES, TANH

import symo
from symo.optim import Symo, SymoConfig
from symo.optim.config import configured
from symo.train.models import MLP

FREE_HEADS = """
[spaces]
head = "identity"
d = { group = "orthogonal", per = "head" }
[params]
"w" = ["(head d)", "_"]
"""


def raises(exc, message: str):
    return pytest.raises(exc, match="^" + re.escape(message) + "$")


@pytest.mark.parametrize("bad,message", [
    ({"beta1": 1.0}, "beta1 must be in [0, 1)"), ({"beta1": 1.5}, "beta1 must be in [0, 1)"),
    ({"weight_decay": float("nan")}, "Invalid weight_decay value: nan (must be a finite number >= 0)"),
    ({"weight_decay": -1.0}, "Invalid weight_decay value: -1.0 (must be a finite number >= 0)"),
    ({"adamw_rms": float("inf")}, "adamw_rms must be > 0, got inf"),
    ({"adamw_rms": 0.0}, "adamw_rms must be > 0, got 0.0"),
    ({"ns_coeffs": (1.0, 2.0)}, "ns_coeffs must be three finite numbers (a, b, c), got (1.0, 2.0)"),
    ({"ns_dtype": "float16"}, "ns_dtype must be one of 'float32', 'bfloat16'; got 'float16'"),
    ({"update_scale": "x"}, "update_scale must be one of 'natural', 'muon', 'adamw'; got 'x'"),
    ({"batch_blocks": "yes"}, "batch_blocks must be one of True, False, 'auto'; got 'yes'"),
    ({"distributed_mode": "ddp"}, "distributed_mode must be one of 'auto', 'off', 'replicated', 'fsdp'; got 'ddp'"),
    ({"eigh_max_size": 0}, "eigh_max_size must be >= 1, got 0"),
])
def test_config_rejects_by_itself(bad, message):
    """SymoConfig checks its own fields (not only through Symo's per-group checks)."""
    with raises(ValueError, message):
        SymoConfig(**bad)


def test_config_boundaries_are_accepted():
    for good in ({"eigh_max_size": 1}, {"ns_steps": 1}, {"ns_inverse_steps": 1}, {"ns_dtype": "bfloat16"},
                 {"beta1": 0.999}, {"adamw_rms": 1e-9}):
        SymoConfig(**good)


def test_constructor_messages():
    model = MLP(SIZES)
    named = list(model.named_parameters())
    w = torch.zeros(3)
    got = "params must be named parameters: model.named_parameters(), a {name: param} dict or param groups; got "
    with raises(TypeError, got + "Tensor"):
        Symo(w, MUON)
    with raises(TypeError, got + "str"):
        Symo("fc1.weight", MUON)
    with raises(TypeError, "mix of param-group dicts and (name, param) pairs"):
        Symo([{"params": named[:2]}, named[2]], MUON)
    with raises(ValueError, "a param group needs a 'params' entry: {'params': [(name, param), ...], ...}"):
        Symo([{"lr": 0.1}], MUON)
    with raises(TypeError, "a param group's 'params' must be [(name, param), ...], got Tensor"):
        Symo([{"params": w}], MUON)
    pairs = ("Symo needs named parameters: pass model.named_parameters() or groups with 'params': "
             "[(name, param), ...]")
    with raises(TypeError, pairs):
        Symo([("fc1.weight", 3.0)], MUON)
    with raises(TypeError, "config must be a SymoConfig, got dict"):
        Symo(named, MUON, config={"beta1": 0.9})
    with raises(TypeError, "unknown option 'bogus'; the options are ['adamw_betas', 'adamw_eps', 'adamw_lr', "
                           "'adamw_rms', 'adamw_wd', 'batch_blocks', 'beta1', 'check_finite', 'compile', "
                           "'distributed_bucket_mb', 'distributed_comm_dtype', 'distributed_mode', 'nesterov', "
                           "'neuron_norm_beta2', 'parameter_rms', 'update_scale', 'weight_decay'], 'preconditioner' "
                           "and the options of the "
                           "chosen kind "
                           "(polar: ['power', 'backend', 'eigh_max_size', 'ns_steps', 'ns_coeffs', 'ns_dtype', "
                           "'ns_method', 'damping', 'damping_mode', 'statistic', 'stats_dtype', 'inverse_root', "
                           "'ns_inverse_steps'])"):
        Symo(named, MUON, bogus=1)
    with raises(TypeError, "beta2 is not an option of preconditioner 'polar' (the polar kind (Symo's default, "
                           "Muon's step) uses this step's statistic alone); it is an option of root, taylor, "
                           "published, eigen_adam, then_orthogonalize: pass preconditioner='root', or a preset of "
                           "one of them (published, notebook, shampoo, eigen_adam, soap, soap_heavyball, "
                           "then_orthogonalize, soap_muon), to use it"):
        Symo(named, MUON, beta2=0.9)
    with raises(TypeError, "momentum must be a MomentumConfig (the momentum coefficient is the option beta1, e.g. "
                           "beta1=0.9), got float"):
        Symo(named, MUON, momentum=0.9)
    with raises(TypeError, "sizes must be a dict {space: int}, got list"):
        Symo(named, MUON, sizes=[8])
    with raises(TypeError, "spec must be a path, a bundled spec name, a Spec or a CompiledSpec, got int"):
        Symo(named, 3)
    with raises(ValueError, "geometric_mean_with: both specs must cover the same parameters; they differ on "
                            "['fc1.bias', 'fc2.bias', 'fc3.bias']"):
        Symo(named, MUON, preconditioner="root", geometric_mean_with=TANH)
    other = symo.compile(MUON, MLP((5, 9, 6, 3)), disk_cache=False)
    with raises(ValueError, "the CompiledSpec was compiled for other shapes: {'fc1.weight': ((9, 5), (8, 5)), "
                            "'fc2.weight': ((6, 9), (6, 8))} (compiled, given)"):
        Symo(named, other)
    opt = Symo(named, MUON)
    with raises(NotImplementedError, "Symo compiles its spec for the parameters given at construction; create a "
                                     "new optimizer to add parameters"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})


def test_other_libraries_names_and_near_misses_are_told_what_symo_calls_them():
    """SOAP's and Adam's option names, and a misspelt option, name Symo's option in the message; a name with no near
    miss gets no guess."""
    named = list(MLP(SIZES).named_parameters())
    cases = {"betas": "(SOAP's and Adam's betas=(b1, b2) are Symo's beta1=b1, the momentum, and adam_beta2=b2, the "
                      "SOAP kinds' second moment)",
             "shampoo_beta": "(SOAP's shampoo_beta is Symo's beta2, the EMA of the Kronecker statistics)",
             "merge_dims": "(Symo has no merge_dims: the spec decides which coordinates form a block)",
             "learning_rate": "(the learning rate is Symo(..., lr=...))",
             "precondition_freq": "(did you mean 'precondition_frequency'?)", "weight_decy": "(did you mean "
             "'weight_decay'?)", "eps_placment": "(did you mean 'eps_placement'?)"}
    for name, hint in cases.items():
        with pytest.raises(TypeError, match=f"^unknown option '{name}' {re.escape(hint)}; the options are "):
            Symo(named, MUON, preset="soap", **{name: 1})
    with pytest.raises(TypeError, match="^unknown option 'bogus'; the options are "):
        Symo(named, MUON, preset="soap", bogus=1)
    with pytest.raises(TypeError, match=re.escape("eps_placment is not an option of preconditioner "
                                                  "'then_orthogonalize' with inner 'eigen_adam' (did you mean "
                                                  "'eps_placement'?); its options are [")):
        configured(SymoConfig(preconditioner="then_orthogonalize", inner="eigen_adam").preconditioner,
                   {"eps_placment": "clamp"})


def test_a_misspelt_preset_is_told_the_nearest():
    named = list(MLP(SIZES).named_parameters())
    for given, meant in (("soap-muon", "soap_muon"), ("Soap", "soap"), ("soap_muom", "soap_muon")):
        with pytest.raises(ValueError, match=f"^unknown preset '{given}' \\(did you mean '{meant}'\\?\\); the "
                                             "presets "):
            Symo(named, MUON, preset=given)
    with pytest.raises(ValueError, match="^unknown preset 'adam'; the presets are"):
        Symo(named, MUON, preset="adam")


def test_group_option_messages_name_the_group_only_when_there_are_several():
    model = MLP(SIZES)
    named = list(model.named_parameters())
    with raises(ValueError, "Invalid learning rate: -0.1 (lr must be a finite number >= 0)"):
        Symo(named, MUON, lr=-0.1)
    with raises(ValueError, "Invalid learning rate: -0.1 (lr must be a finite number >= 0)"):
        Symo([{"params": named, "lr": -0.1}], MUON)
    with raises(ValueError, "param group 1: Invalid learning rate: -0.1 (param group 1: lr must be a finite "
                            "number >= 0)"):
        Symo([{"params": named[:3]}, {"params": named[3:], "lr": -0.1}], MUON)


def test_defaults_config_and_sizes_reach_the_optimizer():
    """lr defaults to 1e-3 (also torch's `defaults`); a SymoConfig is used as given; `sizes` decides a space
    the shapes cannot (a free head count), for the spec and for the geometric mean's second spec."""
    model = MLP(SIZES)
    opt = Symo(model.named_parameters(), MUON)
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.defaults["lr"] == 1e-3
    assert Symo(model.named_parameters(), MUON, lr=0.5).defaults["lr"] == 0.5
    cfg = SymoConfig(preconditioner="root", beta1=0.5, beta2=0.9)
    opt = Symo(model.named_parameters(), MUON, config=cfg)
    assert opt.config == cfg and opt.param_groups[0]["beta1"] == 0.5
    w = torch.nn.Parameter(torch.zeros(12, 5))
    spec = symo.parse_spec(FREE_HEADS)
    for heads in (3, 4):
        opt = Symo({"w": w}, spec, preconditioner="root", sizes={"head": heads}, geometric_mean_with=spec, beta2=0.9)
        assert [b.batch for st in opt.plan for b in st.compiled.blocks] == [heads, heads]


def test_config_tanh_spec_is_accepted_with_its_own_sizes():
    """sizes that agree with the shapes are accepted (a dict, not refused as a non-dict)."""
    model = MLP(SIZES)
    opt = Symo(model.named_parameters(), TANH, sizes={"h1": 8})
    assert opt.compiled.sizes["n_h1"] == 8
