"""The incidence graph (networkx) decides which parameters couple: checked against couplings worked out by hand."""

from pathlib import Path

import symo
from symo.train.models import GPT, GPTConfig, mlp_tanh

SPECS = Path(__file__).resolve().parent.parent / "specs"


def test_shared_hidden_spaces_couple_the_whole_tanh_mlp():
    compiled = symo.compile(SPECS / "mlp_tanh.toml", mlp_tanh(), disk_cache=False)
    # h1 couples fc1 (rows, bias) with fc2's columns; h2 couples fc2 with fc3; fc3.bias is alone
    assert compiled.couplings == [
        (["h1", "h2"], ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight"]),
        ([], ["fc3.bias"]),
    ]


def test_muon_spec_couples_nothing():
    compiled = symo.compile(SPECS / "muon.toml", mlp_tanh(), disk_cache=False)
    assert [params for _, params in compiled.couplings] == [["fc1.weight"], ["fc2.weight"], ["fc3.weight"]]


def test_gpt_heads_couple_within_a_layer_only():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=11, block_size=8))
    compiled = symo.compile(SPECS / "gpt.toml", model, sizes={"dqk{i}": 4, "dvo{i}": 4}, disk_cache=False)
    groups = {(tuple(s), tuple(p)) for s, p in compiled.couplings}
    # components are over blocks: c_attn's q/k rows (dqk) and v rows (dvo) are separate blocks
    assert (("dqk0",), ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias")) in groups
    assert (("dvo0",), ("transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                        "transformer.h.0.attn.c_proj.weight")) in groups
    assert (("mlp0",), ("transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                        "transformer.h.0.mlp.c_proj.weight")) in groups
    assert len(groups) == 6  # (q/k, v/o, MLP) x two layers; layers never couple


def test_summarized_names_fold_layer_indices():
    from symo.runtime.text import summarize_names

    names = [f"h.{i}.ln.weight" for i in range(3)] + ["wte.weight", "h.5.x", "h.7.x"]
    assert summarize_names(names) == "h.{0..2}.ln.weight, wte.weight, h.{5,7}.x"
