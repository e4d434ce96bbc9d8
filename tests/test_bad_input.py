"""Bad input, everywhere: every malformed input gets the documented exception with a short message
that names what is wrong, never an internal error, a hang, or code running.

Families (each a parametrised table below): spec files and text, wrong Python types and values for
the API (spec, shapes, sizes), optimizer options, load_state_dict, sparse gradients; cache damage,
code injection through names and pattern matching on adversarial names are in test_bad_input_code.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from cases import MLP_SPEC

import symo

REPO = Path(__file__).resolve().parents[1]
MLP = {"fc1.weight": (3, 2), "fc1.bias": (3,), "fc2.weight": (2, 3), "fc2.bias": (2,)}
GOOD = MLP_SPEC % "signed_perm"
MAX_MESSAGE = 700  # characters: a message stays readable whatever the input


def check_spec_error(err: symo.SpecError, file: str | None = None) -> None:
    text = str(err)
    assert err.hint and "how to fix:" in text, text
    assert len(text) < MAX_MESSAGE, len(text)
    if file is not None:
        assert err.file == file and file in text


# ---------------------------------------------------------------------------------------------
# Family 1: spec files and spec text -> SpecError (file, key, short message, hint)
# ---------------------------------------------------------------------------------------------

DEEP_ARRAY = "a = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_TABLE = "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n"
SPEC_TEXTS = {
    "control-char-raw": ("[spaces]\nh = \"perm\"\x07\n" + GOOD[GOOD.index("[params]"):], "control character"),
    "newline-in-param-key": (GOOD + '"fc2.bias\\nimport os" = ["_"]\n', "not a valid parameter name"),
    "newline-in-space-key": ('[spaces]\n"h\\n" = "perm"\n[params]\n"fc1.bias" = ["h"]\n', "not a valid space name"),
    "zero-width-space-in-key": (GOOD + '"fc2.bias\\u200b" = ["_"]\n', "not a valid parameter name"),
    "outer-space-in-key": (GOOD + '" fc2.bias" = ["_"]\n', "not a valid parameter name"),
    "empty-key": (GOOD + '"" = ["_"]\n', "not a valid parameter name"),
    "nfkc-collision": (GOOD + '"\\ufb01.w" = ["_"]\n"fi.w" = ["_"]\n', "Unicode normalisation"),
    "per-itself": ('[spaces]\nd = { group = "orthogonal", per = "d" }\n[params]\n"fc1.bias" = ["d"]\n', "per itself"),
    "per-family-chain": ('[spaces]\n"h{i}" = { group = "identity", per = "h{i}x" }\n'
                         '[params]\n"fc{i}.bias" = ["h{i}"]\n', "itself declared per"),
    "per-two-levels": ('[spaces]\na = { group = "orthogonal", per = "b" }\nb = { group = "identity", per = "c" }\n'
                       'c = "identity"\n[params]\n"fc1.weight" = ["(b a)", "_"]\n', "itself declared per"),
    "per-cycle": ('[spaces]\na = { group = "identity", per = "b" }\nb = { group = "identity", per = "a" }\n'
                  '[params]\n"fc1.weight" = ["(a b)", "_"]\n', "itself declared per"),
    "deep-arrays": (DEEP_ARRAY, "nesting too deep"),
    "deep-inline-tables": (DEEP_TABLE, "nesting too deep"),
    "axis-nested-three-deep": ('[spaces]\nh = "perm"\n[params]\n"fc1.bias" = [[["h"]]]\n', "must be a string"),
    "adjacent-captures": ('[spaces]\nh = "perm"\n[params]\n"fc{a}{b}.bias" = ["h"]\n', "two wildcards"),
    "adjacent-star-capture": ('[spaces]\nh = "perm"\n[params]\n"fc*{a}.bias" = ["h"]\n', "two wildcards"),
    "name-not-a-string": ("name = 3\n" + GOOD, "name"),
    "name-multiline": ('name = "a\\nb"\n' + GOOD, "one-line"),
    "description-not-a-string": ("description = [1]\n" + GOOD, "description"),
    "spaces-not-a-table": ('spaces = 3\n[params]\n"fc1.bias" = ["_"]\n', "must be a table"),
    "size-bool": ('[spaces]\nh = { group = "perm", size = true }\n[params]\n"fc1.bias" = ["h"]\n', "positive integer"),
    "size-float": ('[spaces]\nh = { group = "perm", size = 3.0 }\n[params]\n"fc1.bias" = ["h"]\n', "positive integer"),
    "size-negative": ('[spaces]\nh = { group = "perm", size = -3 }\n[params]\n"fc1.bias" = ["h"]\n', "positive"),
    "per-not-a-string": ('[spaces]\nh = { group = "perm", per = 3 }\n[params]\n"fc1.bias" = ["h"]\n', "per must"),
    "group-not-a-string": ('[spaces]\nh = { group = 3 }\n[params]\n"fc1.bias" = ["h"]\n', "unknown group"),
    "long-key": (GOOD + '"' + "x" * 10000 + '" = ["_"]\n', "matches no parameter"),
    "many-unknown-top-keys": ("".join(f"k{i} = 1\n" for i in range(200)) + GOOD, "unknown top-level"),
    "long-group-name": ('[spaces]\nh = { group = "' + "p" * 5000 + '" }\n[params]\n"fc1.bias" = ["h"]\n',
                        "unknown group"),
    "long-undeclared-space": ('[spaces]\nh = "perm"\n[params]\n"fc1.bias" = ["' + "q" * 5000 + '"]\n',
                              "not declared"),
    "many-declared-spaces": ("[spaces]\n" + "".join(f's{i} = "perm"\n' for i in range(300))
                             + '[params]\n"fc1.bias" = ["zz"]\n', "not declared"),
}


@pytest.mark.parametrize("case", SPEC_TEXTS, ids=list(SPEC_TEXTS))
def test_bad_spec_text(case: str, tmp_path: Path) -> None:
    text, needle = SPEC_TEXTS[case]
    path = tmp_path / "spec.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(symo.SpecError) as info:
        symo.compile(path, MLP, disk_cache=False)
    check_spec_error(info.value, str(path))
    assert needle.lower() in str(info.value).lower(), str(info.value)


SPEC_FILES = {
    "not-utf8": b'[spaces]\nh = "perm"\n# caf\xe9\n',
    "utf16": '[spaces]\nh = "perm"\n'.encode("utf-16"),
    "binary-png": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),
    "binary-nul": b"[params]\n\x00\x00\x00",
    "huge": b"# " + b"x" * (1 << 20) + b"\n",
    "a-directory": None,
}


@pytest.mark.parametrize("case", SPEC_FILES, ids=list(SPEC_FILES))
def test_bad_spec_file(case: str, tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    if SPEC_FILES[case] is None:
        path.mkdir()
    else:
        path.write_bytes(SPEC_FILES[case])
    with pytest.raises(symo.SpecError) as info:
        symo.load_spec(path)
    check_spec_error(info.value, str(path))


# ---------------------------------------------------------------------------------------------
# Family 2: wrong Python types and values for spec, shapes, sizes and dims
# ---------------------------------------------------------------------------------------------

API_CASES = [
    ("parse_spec-bytes", lambda: symo.parse_spec(GOOD.encode()), TypeError, "decode"),
    ("parse_spec-none", lambda: symo.parse_spec(None), TypeError, "text"),
    ("parse_spec-source-int", lambda: symo.parse_spec(GOOD, source=3), TypeError, "source"),
    ("load_spec-int", lambda: symo.load_spec(3), TypeError, "path"),
    ("load_spec-none", lambda: symo.load_spec(None), TypeError, "path"),
    ("compile-spec-int", lambda: symo.compile(3, MLP), TypeError, "spec"),
    ("compile-spec-dict", lambda: symo.compile({"params": {}}, MLP), TypeError, "spec"),
    ("shapes-list", lambda: symo.compile(symo.parse_spec(GOOD), [("fc1.weight", (3, 2))]), TypeError, "shapes"),
    ("shapes-none", lambda: symo.compile(symo.parse_spec(GOOD), None), TypeError, "shapes"),
    ("shapes-str", lambda: symo.compile(symo.parse_spec(GOOD), "fc1.weight"), TypeError, "shapes"),
    ("shape-str-6", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": "6"}), TypeError, "fc1.bias"),
    ("shape-int", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": 3}), TypeError, "fc1.bias"),
    ("shape-none", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": None}), TypeError, "fc1.bias"),
    ("dim-float", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": (3.0,)}), TypeError, "fc1.bias"),
    ("dim-bool", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": (True,)}), TypeError, "fc1.bias"),
    ("dim-str", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": ("3",)}), TypeError, "fc1.bias"),
    ("dim-negative", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": (-3,)}), ValueError, "fc1.bias"),
    ("dim-zero", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": (0,)}), symo.SpecError, "fc1.bias"),
    ("name-int", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, 3: (2,)}), TypeError, "names"),
    ("name-newline", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "a\nimport os": (2,)}), ValueError,
     "control"),
    ("name-empty", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "": (2,)}), ValueError, "empty"),
    ("names-nfkc", lambda: symo.compile(symo.parse_spec(GOOD), {**MLP, "\ufb01": (2,), "fi": (2,)}), ValueError,
     "normalisation"),
    ("sizes-list", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes=[("h", 3)]), TypeError, "sizes"),
    ("sizes-str-value", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={"h": "3"}), TypeError, "'h'"),
    ("sizes-float-value", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={"h": 3.0}), TypeError, "'h'"),
    ("sizes-bool-value", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={"h": True}), TypeError, "'h'"),
    ("sizes-int-key", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={3: 3}), TypeError, "sizes"),
    ("sizes-zero", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={"h": 0}), symo.SpecError, "'h'"),
    ("sizes-negative", lambda: symo.compile(symo.parse_spec(GOOD), MLP, sizes={"h": -1}), symo.SpecError, "'h'"),
    ("cache_dir-int", lambda: symo.compile(symo.parse_spec(GOOD), MLP, cache_dir=3), TypeError, "cache_dir"),
    ("disk_cache-str", lambda: symo.compile(symo.parse_spec(GOOD), MLP, disk_cache="no"), TypeError, "disk_cache"),
    ("gather-list", lambda: compiled_good().gather([1]), TypeError, "dict"),
    ("gather-not-tensor", lambda: compiled_good().gather({n: s for n, s in MLP.items()}), TypeError, "fc1.weight"),
    ("gather-wrong-shape", lambda: compiled_good().orbit_average({n: torch.zeros(2) for n in MLP}), ValueError,
     "fc1.weight"),
]


def compiled_good() -> symo.CompiledSpec:
    return symo.compile(symo.parse_spec(GOOD), MLP, disk_cache=False)


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_misuse_names_the_argument(case) -> None:
    _, call, exc_type, needle = case
    with pytest.raises(exc_type) as info:
        call()
    text = str(info.value)
    assert needle.lower() in text.lower() and len(text) < MAX_MESSAGE, text
    if exc_type is TypeError:
        assert not isinstance(info.value, symo.SpecError)


def test_the_shape_6_case_is_reported_as_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"shapes\['fc1.bias'\] must be a tuple of ints.*'6' \(str\)"):
        symo.compile(symo.parse_spec(GOOD), {**MLP, "fc1.bias": "6"}, disk_cache=False)


# ---------------------------------------------------------------------------------------------
# Family 3: optimizer options, validated as torch.optim validates its own
# ---------------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
OPTION_CASES = [
    ({"lr": -1e-3}, ValueError, "lr"), ({"lr": NAN}, ValueError, "lr"), ({"lr": INF}, ValueError, "lr"),
    ({"lr": "0.1"}, TypeError, "lr"),
    ({"weight_decay": -0.1}, ValueError, "weight_decay"), ({"weight_decay": NAN}, ValueError, "weight_decay"),
    ({"beta1": 1.0}, ValueError, "beta1"), ({"beta1": -0.1}, ValueError, "beta1"),
    ({"beta1": NAN}, ValueError, "beta1"),
    ({"beta1": "0.9"}, TypeError, "beta1"),
    ({"preconditioner": "root", "beta2": 1.5}, ValueError, "beta2"),
    ({"preconditioner": "root", "beta2": NAN}, ValueError, "beta2"),
    ({"beta2": 0.9}, TypeError, "beta2 is not an option of preconditioner 'polar'"),
    ({"damping": -1.0}, ValueError, "damping"), ({"damping": NAN}, ValueError, "damping"),
    ({"damping": INF}, ValueError, "damping"),
    ({"power": 0.0}, ValueError, "power"), ({"power": NAN}, ValueError, "power"),
    ({"power": -INF}, ValueError, "power"),
    ({"preconditioner": "root", "precondition_frequency": 0}, ValueError, "precondition_frequency"),
    ({"preconditioner": "root", "precondition_frequency": 1.5}, TypeError, "precondition_frequency"),
    ({"ns_steps": 0}, ValueError, "ns_steps"), ({"ns_steps": 2.5}, TypeError, "ns_steps"),
    ({"ns_inverse_steps": 0}, ValueError, "ns_inverse_steps"),
    ({"ns_coeffs": (1.0, 2.0)}, ValueError, "ns_coeffs"), ({"ns_coeffs": (1.0, NAN, 2.0)}, ValueError, "ns_coeffs"),
    ({"ns_coeffs": "abc"}, TypeError, "ns_coeffs"),
    ({"eigh_max_size": 0}, ValueError, "eigh_max_size"),
    ({"adamw_lr": -1.0}, ValueError, "adamw_lr"), ({"adamw_eps": -1e-8}, ValueError, "adamw_eps"),
    ({"adamw_betas": (0.9, 1.5)}, ValueError, "adamw_betas"), ({"adamw_betas": (-0.1, 0.9)}, ValueError, "adamw_betas"),
    ({"adamw_betas": (0.9,)}, TypeError, "adamw_betas"), ({"adamw_wd": -1.0}, ValueError, "adamw_wd"),
    ({"adamw_rms": 0.0}, ValueError, "adamw_rms"),
    ({"backend": "cholesky"}, ValueError, "backend"), ({"backend": 3}, TypeError, "backend"),
    ({"update_scale": "big"}, ValueError, "update_scale"), ({"statistic": "weights"}, ValueError, "statistic"),
    ({"preconditioner": "fisher"}, ValueError, "preconditioner"), ({"damping_mode": "both"}, ValueError,
                                                                   "damping_mode"),
    ({"preconditioner": "then_orthogonalize", "inner": "svd"}, ValueError, "inner"),
    ({"preconditioner": "published", "damping_scope": "layer"}, ValueError, "damping_scope"),
    ({"nesterov": "yes"}, TypeError, "nesterov"), ({"check_finite": 1}, TypeError, "check_finite"),
    ({"compile": None}, TypeError, "compile"),
    ({"preconditioner": "root", "geometric_mean_with": 3}, TypeError, "geometric_mean_with"),
    ({"learning_rate": 0.1}, TypeError, "learning_rate"),
]


@pytest.mark.parametrize("options,exc_type,option", OPTION_CASES, ids=[f"{o}" for o, _, _ in OPTION_CASES])
def test_bad_optimizer_option_names_it(options: dict, exc_type: type, option: str) -> None:
    model = net()
    with pytest.raises(exc_type, match=re.escape(option)):
        symo.Symo(model.named_parameters(), "mlp_tanh", **options)


GROUP_CASES = [
    ({"lr": -0.1}, ValueError, "lr"), ({"weight_decay": -1.0}, ValueError, "weight_decay"),
    ({"beta1": 2.0}, ValueError, "beta1"), ({"adamw_lr": NAN}, ValueError, "adamw_lr"),
    ({"nesterov": 0}, ValueError, "nesterov"), ({"momentum": 0.9}, ValueError, "per-group options"),
]


@pytest.mark.parametrize("options,exc_type,option", GROUP_CASES, ids=[f"{o}" for o, _, _ in GROUP_CASES])
def test_bad_param_group_option_names_it(options: dict, exc_type: type, option: str) -> None:
    named = list(net().named_parameters())
    groups = [{"params": named[:2]}, {"params": named[2:], **options}]
    with pytest.raises(exc_type, match=re.escape(option)):
        symo.Symo(groups, "mlp_tanh")


ARG_CASES = [
    ("params-tensor", lambda m: symo.Symo(torch.zeros(3), "mlp_tanh"), TypeError, "params"),
    ("params-int", lambda m: symo.Symo(3, "mlp_tanh"), TypeError, "params"),
    ("params-unnamed", lambda m: symo.Symo(m.parameters(), "mlp_tanh"), TypeError, "named"),
    ("params-name-not-tensor", lambda m: symo.Symo([("w", 3)], "mlp_tanh"), TypeError, "named"),
    ("group-without-params", lambda m: symo.Symo([{"lr": 0.1}], "mlp_tanh"), ValueError, "params"),
    ("spec-int", lambda m: symo.Symo(m.named_parameters(), 3), TypeError, "spec"),
    ("sizes-list", lambda m: symo.Symo(m.named_parameters(), "mlp_tanh", sizes=[1]), TypeError, "sizes"),
    ("config-dict", lambda m: symo.Symo(m.named_parameters(), "mlp_tanh", config={"beta1": 0.9}), TypeError, "config"),
]


@pytest.mark.parametrize("case", ARG_CASES, ids=[c[0] for c in ARG_CASES])
def test_bad_optimizer_arguments(case) -> None:
    _, call, exc_type, needle = case
    with pytest.raises(exc_type, match=needle):
        call(net())


# ---------------------------------------------------------------------------------------------
# Family 4: load_state_dict checked against spec, widths and parameters
# ---------------------------------------------------------------------------------------------


def net(hidden: int = 4) -> torch.nn.Module:
    return symo.models.MLP((3, hidden, 4, 2))


def trained(model: torch.nn.Module, spec: str = "mlp_tanh", extra: bool = False, **options) -> symo.Symo:
    params = list(model.named_parameters()) + ([("extra.weight", torch.nn.Parameter(torch.ones(2)))] if extra else [])
    opt = symo.Symo(params, spec, lr=0.01, **options)
    for _ in range(2):
        opt.zero_grad()
        (model(torch.randn(5, 3)).square().sum() + sum(p.sum() for _, p in params[len(params) - extra:])).backward()
        opt.step()
    return opt


def edited(state: dict, fn) -> dict:
    fn(state)
    return state


def blocks_in(state_dict: dict) -> dict:
    """The block statistics of a saved state dict (on the anchor parameter's entry)."""
    return next(v["symo_blocks"] for v in state_dict["state"].values() if "symo_blocks" in v)


STATE_CASES = {
    "other-spec": (lambda: trained(net(), "muon").state_dict(), ValueError, "spec"),
    "other-width": (lambda: trained(net(5)).state_dict(), ValueError, "widths"),
    "other-params": (lambda: trained(net(), extra=True).state_dict(), ValueError, "extra.weight"),
    "momentum-shape": (lambda: edited(trained(net()).state_dict(),
                                      lambda s: s["state"][0].update(momentum_buffer=torch.zeros(9))),
                       ValueError, "momentum_buffer"),
    "foreign-block": (lambda: edited(trained(net(), preconditioner="root", beta2=0.9).state_dict(),
                                     lambda s: blocks_in(s).update(L99={"ema": torch.zeros(1, 2, 2)})),
                      ValueError, "L99"),
    "block-shape": (lambda: edited(trained(net(), preconditioner="root", beta2=0.9).state_dict(),
                                   lambda s: blocks_in(s)["L0"].update(ema=torch.zeros(1, 2, 2))),
                    ValueError, "L0"),
    "not-a-dict": (lambda: [1, 2], TypeError, "state_dict"),
    "missing-groups": (lambda: {"state": {}}, TypeError, "param_groups"),
}


@pytest.mark.parametrize("case", STATE_CASES, ids=list(STATE_CASES))
def test_load_state_dict_refuses_a_mismatched_checkpoint(case: str) -> None:
    make, exc_type, needle = STATE_CASES[case]
    torch.manual_seed(0)
    state = make()
    opt = trained(net(), **({"preconditioner": "root", "beta2": 0.9} if case in ("foreign-block",
                                                                                 "block-shape") else {}))
    before = {k: v.clone() for k, v in opt.state_dict()["state"][0].items() if torch.is_tensor(v)}
    with pytest.raises(exc_type, match=needle):
        opt.load_state_dict(state)
    after = opt.state_dict()["state"][0]  # refused before anything was loaded
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_load_state_dict_accepts_its_own_checkpoint() -> None:  # the check is not a wall
    torch.manual_seed(0)
    model = net()
    opt = trained(model, preconditioner="root", beta2=0.9)
    twin = symo.Symo(model.named_parameters(), "mlp_tanh", preconditioner="root", lr=0.01, beta2=0.9)
    twin.load_state_dict(opt.state_dict())


# ---------------------------------------------------------------------------------------------
# Family 5: sparse gradients
# ---------------------------------------------------------------------------------------------


def test_sparse_gradient_of_an_uncovered_parameter_is_refused() -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    model = net()
    params = [("emb.weight", emb.weight), *model.named_parameters()]
    opt = symo.Symo(params, "mlp_tanh")
    model(emb(torch.tensor([1, 2]))).sum().backward()
    assert emb.weight.grad.is_sparse
    with pytest.raises(RuntimeError, match="sparse gradients.*emb.weight"):
        opt.step()


def test_sparse_gradient_of_a_covered_parameter_is_refused() -> None:
    model = net()
    opt = symo.Symo(model.named_parameters(), "mlp_tanh")
    model.fc1.weight.grad = torch.eye(4, 3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse gradients.*fc1.weight"):
        opt.step()
