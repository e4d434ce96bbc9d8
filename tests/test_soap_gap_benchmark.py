"""benchmarks/soap_gap.py, without training: which runs it reuses from the campaign's cache, that each variant
changes what its label says of its study's base, and its table's paired intervals against a hand-computed
Student t."""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.harness import RunCache
from benchmarks.nanogpt_matrix_runs import REGIMES, RESULTS
from benchmarks.soap_gap import jobs, muon_runs, six_seeds, summarize
from benchmarks.soap_gap_studies import EXTRA_SEEDS, SEEDS, SIX_SEEDS, STUDIES

SOAP = STUDIES["soap"]


def test_campaign_runs_are_reused_and_the_others_carry_their_own_configuration(tmp_path) -> None:
    campaign = RunCache(tmp_path / "campaign.json")
    planned = jobs(campaign)  # an empty campaign: every run is new, each with its variant's options
    # seeds 3-5 for each study's six-seed variant, and for a base that is no campaign arm (qkv_polar_sides',
    # qkv_rotation's and decay_soap_muon's base is the qkv study's six-seed variant: the same runs)
    six = {(job["study"], job["variant"]) for job in planned if job["seed"] in EXTRA_SEEDS}
    assert six == {("soap_muon", "soap_muon_neuron_norm"), ("qkv", "soap_muon_qkv"),
                   ("qkv_polar_sides", "soap_muon_qkv"), ("qkv_polar_sides", "soap_muon_qkv_one_sided"),
                   ("qkv_rotation", "soap_muon_qkv"), ("qkv_rotation", "soap_muon_qkv_unrotated"),
                   ("decay_soap_muon", "soap_muon_qkv"), ("decay_soap_muon", "soap_muon_qkv_wd_0.05")}
    assert len(planned) == (sum(len(study.variants) for study in STUDIES.values()) * len(SEEDS)
                            + len(six) * len(EXTRA_SEEDS))
    # a variant with options runs them; one without is its campaign arm itself, at the variant's decay
    for job in planned:
        study = STUDIES[job["study"]]
        _, arm, options = study.variants[job["variant"]]
        assert job["wd"] == study.wds.get(job["variant"], study.wd) and job["lr"] == study.lr
        if options is None:
            assert job["arm"] == arm and "arm_config" not in job
        else:
            assert job["arm_config"]["options"] == options
    assert {(job["lr"], job["wd"]) for job in planned if job["study"] == "soap_muon"} == {(0.02, 0.1)}
    assert {(job["variant"], job["wd"]) for job in planned if job["study"] == "decay_heavyball"} == {
        ("heavyball_soap", 0.1), ("heavyball_soap_wd_0.2", 0.2)}
    reused = next(job for job in planned if job["variant"] == "soap" and job["seed"] == 0)
    campaign_key = reused["key"].replace("soap_gap_soap", "symo_soap_gpt_muon")
    campaign.put(campaign_key, {"final_val": 1.5})
    again = next(job for job in jobs(campaign) if job["variant"] == "soap" and job["seed"] == 0)
    assert again["key"] == campaign_key and "arm_config" not in again
    # one run per variant and seed: a variant two studies name (each study's base is a row of another) is one run
    assert len({job["key"] for job in jobs(campaign)}) == len({(job["variant"], job["seed"]) for job in planned})
    for variant in {job["variant"] for job in planned}:
        named = [(study.lr, study.wds.get(variant, study.wd), study.variants[variant][1:])
                 for study in STUDIES.values() if variant in study.variants]
        assert all(entry == named[0] for entry in named), variant


def test_each_variant_changes_the_soap_preset_where_it_says() -> None:
    from symo.optim.presets import get_preset

    soap = get_preset("soap").values
    changed = {variant: {k for k, v in options.items() if k != "preset" and soap[k] != v}
               for variant, (_, _, options) in SOAP.variants.items() if options["preset"] == "soap"}
    assert changed == {"soap": set(), "soap_beta1_0.9": {"beta1"}, "soap_refresh_2": {"precondition_frequency"},
                       "soap_both_defaults": {"beta1", "precondition_frequency"}}
    assert SOAP.variants["soap_heavyball"][2] == {"preset": "soap_heavyball"}


def test_each_soap_muon_variant_changes_what_its_label_names() -> None:
    from benchmarks.nanogpt_matrix_runs import ARMS
    from symo.optim import PowerQR
    from symo.optim.presets import get_preset

    study = STUDIES["soap_muon"]
    base_label, arm, base = study.variants[study.base]
    assert ARMS[arm]["options"] == base and (study.lr, study.wd) == (0.02, 0.1)
    preset = get_preset("soap_muon").values
    assert preset["beta2"] == 0.95 and "adam_beta2" not in base  # the kind's default, SOAP's 0.95
    changed = {variant: {k: v for k, v in options.items() if base.get(k) != v}
               for variant, (_, _, options) in study.variants.items()}
    assert changed == {"soap_muon": {}, "soap_muon_adam_beta2_0.99": {"adam_beta2": 0.99},
                       "soap_muon_beta2_0.99": {"beta2": 0.99},
                       "soap_muon_both_0.99": {"adam_beta2": 0.99, "beta2": 0.99},
                       "soap_muon_qr_shift": {"refresh": PowerQR(lift=1e-8)},
                       "soap_muon_neuron_norm": {"neuron_norm_beta2": 0.95}}


def _runs(finals: list[float], curve_shift: float) -> list[dict]:
    return [{"seed": s, "final_val": f, "evals": [(0, 3.0), (500, 1.6 + curve_shift), (1000, f)]}
            for s, f in zip(SEEDS, finals)]


def test_the_table_pairs_each_variant_with_soap_seed_by_seed() -> None:
    soap, faster = [1.55, 1.54, 1.56], [1.53, 1.535, 1.54]
    records = {v: [] for v in SOAP.variants}
    records["soap"], records["soap_refresh_2"] = _runs(soap, 0.0), _runs(faster, -0.1)
    data, table = summarize(SOAP, records, muon_final=1.547, muon_steps=1000)
    d = [a - b for a, b in zip(faster, soap)]
    half = 4.302652729911275 * statistics.stdev(d) / math.sqrt(3)  # Student t(0.975, 2 degrees of freedom)
    assert data["soap_refresh_2"]["diff_to_base_ci95"] == pytest.approx([statistics.mean(d) - half,
                                                                         statistics.mean(d) + half])
    assert data["soap_refresh_2"]["steps_to_muon_final"] == 500  # the seed-mean curve is at 1.5 by step 500
    assert data["soap_refresh_2"]["steps_to_muon_final_ratio"] == 0.5 and "| 500 (0.50x) |" in table
    assert data["soap"]["steps_to_muon_final"] is None  # its seed mean ends at 1.55, above Muon's 1.547
    assert "| not reached |" in table
    assert "soap, beta1 0.9 | 0 of 3 seeds" in table


def test_each_heavyball_detail_is_added_alone_and_all_three_are_soap_heavyball() -> None:
    from symo.optim import PowerQR
    from symo.optim.presets import get_preset

    study = STUDIES["heavyball_details"]
    assert study.base == "soap_both_defaults" and (study.lr, study.wd) == (SOAP.lr, SOAP.wd)
    base = study.variants[study.base][2]
    assert base == SOAP.variants["soap_both_defaults"][2]
    added = {variant: {k: v for k, v in options.items() if base.get(k) != v}
             for variant, (_, _, options) in study.variants.items() if variant not in (study.base, "soap_heavyball")}
    assert added == {"soap_hb_phase": {"refresh_phase": "heavyball"}, "soap_hb_clamp": {"eps_placement": "clamp"},
                     "soap_hb_qr_shift": {"refresh": PowerQR(lift=1e-8)}}
    # the preset soap_heavyball is soap with heavyball's two defaults and these three details, and nothing else
    # that acts on the campaign's GPT (max_precond_dim 2048 against 10000: its sides are at most 512)
    soap, heavyball = get_preset("soap").values, get_preset("soap_heavyball").values
    merged = {**soap, **{k: v for k, v in base.items() if k != "preset"}}
    for change in added.values():
        merged.update(change)
    differ = {k for k in soap.keys() | heavyball.keys() if merged.get(k) != heavyball.get(k)}
    assert differ == {"max_precond_dim"} and study.variants["soap_heavyball"][2] == {"preset": "soap_heavyball"}


def test_the_six_seed_rows_of_the_base_and_of_muon_are_soap_seeds_own() -> None:
    """On the committed caches, the six-seed table's SOAP-Muon and Muon rows (built here from the campaign's and
    soap_seeds' runs) equal benchmarks/soap_seeds.py's six-seed figures, computed there by code of its own; with the
    variant's own runs absent the table waits (None). Muon's runs stand in for the variant's."""
    import json

    study = STUDIES["soap_muon"]
    campaign = RunCache(RESULTS / "nanogpt_matrix_reference_runs.json")
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    base = [campaign[job["key"]] for job in jobs(campaign) if job["variant"] == study.base]
    muon = muon_runs(campaign, seeds_cache)
    variant = SIX_SEEDS["soap_muon"]
    assert six_seeds(study, variant, {study.base: base, variant: []}, seeds_cache, muon) is None
    data, table = six_seeds(study, variant, {study.base: base, variant: list(muon.values())}, seeds_cache, muon)
    reference = json.loads((RESULTS / "soap_seeds.json").read_text())["regimes"]["reference"]["arms"]
    for name, arm in ((study.base, "symo_soap_muon_gpt_muon"), ("muon", "muon")):
        theirs = reference[arm]["seeds_6"]
        assert data[name]["final_val_mean"] == pytest.approx(theirs["final_val_mean"], abs=1e-12)
        assert data[name]["muon_loss_steps_ratio"] == pytest.approx(theirs.get("muon_loss_steps_ratio", 1.0), abs=1e-9)
    assert data[study.base]["diff_to_muon_ci95"] == pytest.approx(
        reference["symo_soap_muon_gpt_muon"]["seeds_6"]["diff_to_muon_ci95"], abs=1e-12)
    assert "| Muon |" in table


def changed_from_the_qkv_default_step(study_name: str) -> dict[str, dict]:
    """Per variant of a study on symo train's default step: the options it changes from its base, which is the qkv
    study's SOAP-Muon on gpt_muon_qkv at that study's rate and decay (every variant on gpt_muon_qkv)."""
    study = STUDIES[study_name]
    base = study.variants[study.base][2]
    assert base == STUDIES["qkv"].variants["soap_muon_qkv"][2] and (study.lr, study.wd) == (0.02, 0.1)
    assert study.spec == "gpt_muon_qkv" and not study.specs
    return {variant: {k: v for k, v in options.items() if base.get(k) != v}
            for variant, (_, _, options) in study.variants.items()}


def test_the_signed_root_variant_adds_only_the_authors_power() -> None:
    assert changed_from_the_qkv_default_step("qkv_signed_root") == {
        "soap_muon_qkv": {}, "soap_muon_qkv_root": {"eigenbasis_power": 0.5}}


def test_the_polar_and_sides_variants_change_only_what_their_labels_name() -> None:
    from symo import Symo
    from symo.optim import NewtonSchulz
    from symo.train.models import GPT, GPTConfig

    study = STUDIES["qkv_polar_sides"]
    assert changed_from_the_qkv_default_step("qkv_polar_sides") == {
        "soap_muon_qkv": {}, "soap_muon_qkv_ns": {"backend": NewtonSchulz()},
        "soap_muon_qkv_one_sided": {"two_sided": False}}
    # on the reference model the base takes every block's polar factor exactly, the variant by Muon's iteration
    setup = REGIMES["reference"]
    model = GPT(GPTConfig(block_size=setup["block_size"], vocab_size=80, n_layer=setup["n_layer"],
                          n_head=setup["n_head"], n_embd=setup["n_embd"]))
    for variant, backend in (("soap_muon_qkv", "eigh"), ("soap_muon_qkv_ns", "newton_schulz (iterate)")):
        blocks = [line for line in Symo(model, "gpt_muon_qkv", lr=0.02, **study.variants[variant][2]).describe()
                  .splitlines() if line.lstrip().startswith("L") and "backend=" in line]
        assert len(blocks) == 4 * setup["n_layer"] and all(f"backend={backend};" in line for line in blocks), blocks


def test_a_base_that_is_no_campaign_arm_brings_its_own_seeds_3_to_5() -> None:
    study = STUDIES["qkv_polar_sides"]
    variant = SIX_SEEDS["qkv_polar_sides"]
    assert study.variants[study.base][1] is None
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    muon = muon_runs(RunCache(RESULTS / "nanogpt_matrix_reference_runs.json"), seeds_cache)

    def runs(level: float) -> list[dict]:
        return [{"seed": s, "final_val": level + 1e-3 * s, "evals": [(0, 3.0), (1000, level + 1e-3 * s)]}
                for s in SEEDS + EXTRA_SEEDS]

    base, other = runs(1.52), runs(1.53)
    assert six_seeds(study, variant, {study.base: base[:3], variant: other}, seeds_cache, muon) is None
    data, table = six_seeds(study, variant, {study.base: base, variant: other}, seeds_cache, muon)
    assert data[study.base]["final_val_mean"] == pytest.approx(1.52 + 2.5e-3)
    assert data[variant]["diff_to_base_ci95"] == pytest.approx([0.01, 0.01])
    assert "seeds 3-5 of Muon from" in table



def test_the_rotation_variants_leave_unrotated_only_the_sides_their_labels_name() -> None:
    """On the reference GPT: the preset rotates both sides of every block; max_precond_dim 1 rotates none (Adam's
    second moment in the weights' coordinates, then the polar factor); max_precond_dim 128 leaves only the MLP's
    512-wide sides unrotated."""
    from symo import Symo
    from symo.train.models import GPT, GPTConfig

    study = STUDIES["qkv_rotation"]
    assert changed_from_the_qkv_default_step("qkv_rotation") == {
        "soap_muon_qkv": {}, "soap_muon_qkv_unrotated": {"max_precond_dim": 1},
        "soap_muon_qkv_max_128": {"max_precond_dim": 128}}
    setup = REGIMES["reference"]
    d = setup["n_embd"]
    model = GPT(GPTConfig(block_size=setup["block_size"], vocab_size=80, n_layer=setup["n_layer"],
                          n_head=setup["n_head"], n_embd=d))
    expected = {"soap_muon_qkv": {(d, d): (True, True), (d, 4 * d): (True, True), (4 * d, d): (True, True)},
                "soap_muon_qkv_unrotated": {(d, d): (False, False), (d, 4 * d): (False, False),
                                            (4 * d, d): (False, False)},
                "soap_muon_qkv_max_128": {(d, d): (True, True), (d, 4 * d): (True, False), (4 * d, d): (False, True)}}
    for variant, sides in expected.items():
        opt = Symo(model, "gpt_muon_qkv", lr=0.02, **study.variants[variant][2])
        shapes = {(b.mult, b.width) for stage in opt.plan for b in stage.compiled.blocks}
        assert shapes == set(sides), shapes
        assert {shape: opt.kind.inner.rotated_sides(*shape) for shape in shapes} == sides, variant


def blocks_on_a_small_gpt(spec: str, sizes: dict[str, int] | None = None) -> dict[str, tuple]:
    """{block name: (batch, mult, width, its parameters)} of `spec` compiled for a 2-layer GPT of width 8."""
    from symo import compile
    from symo.train.models import GPT, GPTConfig

    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8))
    compiled = compile(spec, {n: tuple(p.shape) for n, p in model.named_parameters()}, sizes=sizes)
    return {b.name: (b.batch, b.mult, b.width, b.params) for b in compiled.blocks}


def attention_and_mlp(blocks: dict[str, tuple]) -> tuple[dict, dict]:
    """The blocks holding an attention parameter, and those holding an MLP parameter."""
    return tuple({n: b for n, b in blocks.items() if any(f".{part}." in p for p in b[3])} for part in ("attn", "mlp"))


def test_the_mlp_coupling_study_changes_only_the_spec_of_muons_step() -> None:
    """Muon's step with each MLP one block: the same options, rate and decay as the qkv_muon study's gpt_muon_qkv
    run (one run, shared), on gpt_muon_qkv_mlp, whose blocks couple c_fc and c_proj and nothing else."""
    study = STUDIES["mlp_coupling_muon"]
    base, coupled = study.variants["muon_step_qkv"], study.variants["muon_step_qkv_mlp"]
    assert base == STUDIES["qkv_muon"].variants["muon_step_qkv"] and coupled[1:] == base[1:]
    assert (study.lr, study.wd) == (STUDIES["qkv_muon"].lr, STUDIES["qkv_muon"].wd)
    assert study.spec == "gpt_muon_qkv" and study.specs == {"muon_step_qkv_mlp": "gpt_muon_qkv_mlp"}
    qkv_attention, qkv_mlp = attention_and_mlp(blocks_on_a_small_gpt("gpt_muon_qkv"))
    attention, mlp = attention_and_mlp(blocks_on_a_small_gpt("gpt_muon_qkv_mlp"))
    assert attention == qkv_attention and len(attention) == 4
    assert sorted(b[3] for b in mlp.values()) == [(f"transformer.h.{i}.mlp.c_fc.weight",
                                                   f"transformer.h.{i}.mlp.c_proj.weight") for i in range(2)]
    assert all(len(b[3]) == 1 for b in qkv_mlp.values()) and len(qkv_mlp) == 4


def test_the_true_rms_variant_changes_only_parameter_rms_from_the_campaigns_gpt_true_arm() -> None:
    from benchmarks.nanogpt_matrix_runs import ARMS
    from symo.optim import SymoConfig

    study = STUDIES["true_rms"]
    (_, arm, base), (_, own_arm, variant) = study.variants.values()
    assert arm == "symo_soap_muon_gpt_true" and base == ARMS[arm]["options"] and own_arm is None
    assert study.spec == ARMS[arm]["spec"] == "gpt_true" and not study.specs
    assert {k: v for k, v in base.items() if variant.get(k) != v} == {"parameter_rms": False}
    assert "parameter_rms" not in variant and SymoConfig().parameter_rms  # the variant takes Symo's default


def test_the_true_attention_spec_is_gpt_trues_attention_with_gpt_muon_qkvs_mlp() -> None:
    """The study spec's blocks: gpt_true's attention blocks (per-head gauges, c_attn's bias with them) and
    gpt_muon_qkv's MLP blocks, each the same as in its own spec; the variant changes nothing else from its base."""
    study = STUDIES["true_attention"]
    (_, arm, base), (_, _, variant) = study.variants.values()
    assert arm == "symo_soap_muon_gpt_muon_qkv" and base == variant and (study.lr, study.wd) == (0.02, 0.1)
    sizes = {"dqk{i}": 4, "dvo{i}": 4}
    attention, mlp = attention_and_mlp(blocks_on_a_small_gpt(study.specs["soap_muon_true_attention"], sizes))
    assert attention == attention_and_mlp(blocks_on_a_small_gpt("gpt_true", sizes))[0] and len(attention) == 4
    assert mlp == attention_and_mlp(blocks_on_a_small_gpt("gpt_muon_qkv"))[1] and len(mlp) == 4


def test_the_true_mlp_spec_is_gpt_muon_qkv_mlp_with_gpt_trues_mlp() -> None:
    """The study spec's blocks: gpt_muon_qkv_mlp's attention blocks and gpt_true's MLP blocks (per-layer perm blocks
    with c_fc's bias, and every layer's mean direction in one block), each the same as in its own spec; the variant
    changes nothing else from the campaign's coupled arm."""
    from benchmarks.nanogpt_matrix_runs import ARMS

    study = STUDIES["true_mlp"]
    (_, arm, base), (_, own_arm, variant) = study.variants.values()
    assert arm == "symo_soap_muon_gpt_muon_qkv_mlp" and own_arm is None and base == variant == ARMS[arm]["options"]
    assert study.spec == ARMS[arm]["spec"] and (study.lr, study.wd) == (0.02, 0.1)
    attention, mlp = attention_and_mlp(blocks_on_a_small_gpt(study.specs["soap_muon_true_mlp"]))
    assert attention == attention_and_mlp(blocks_on_a_small_gpt("gpt_muon_qkv_mlp"))[0] and len(attention) == 4
    assert mlp == attention_and_mlp(blocks_on_a_small_gpt("gpt_true", {"dqk{i}": 4, "dvo{i}": 4}))[1]
    assert sorted(len(b[3]) for b in mlp.values()) == [3, 3, 6]  # each layer's hidden units, and the mean block
