"""How far apart the nanoGPT campaign's SOAP arms really are: three more seeds, and the run-to-run floor.

The campaign (benchmarks/nanogpt_matrix.py) reports 3 seeds. In its reference regime heavyball's SOAP reaches
Muon's final loss in 0.84x Muon's steps and Symo's best kinds in 0.88-0.90x, while `soap_heavyball` is heavyball's
algorithm (tests/test_soap.py). This script asks whether those gaps are more than noise:

- first update: on the reference GPT, how far apart two runs are after their first update when their initial
  weights differ by a relative 1e-7 (float32 rounding), for the same optimizer, and for Symo against the library;
- six seeds, in both regimes: seeds 3, 4 and 5 for Muon, heavyball's SOAP, `soap_heavyball`, SOAP-Muon (on
  gpt_muon and on gpt_muon_qkv), `soap` and the authors' SOAP (pytorch-optimizer) at the campaign's tuned rate and
  decay, reported with the campaign's seeds 0-2 (same initialization and batches per seed across arms);
- whether the true symmetry helps SOAP, in both regimes: `soap` and SOAP-Muon on the true-symmetry spec
  (gpt_true: per-head O(k) gauges, statistics shared by units) at their own tuned rates and decays, six seeds
  each, paired seed by seed with the same kind on the Muon-style spec (gpt_muon);
- floor (reference regime): heavyball's SOAP at seeds 0-2 with the initial weights moved by 1e-7, paired with the
  campaign's runs.

    python -m benchmarks.soap_seeds              # 54 runs of 1-10 minutes on 2 workers (about 250 worker-minutes)
    python -m benchmarks.soap_seeds --report     # train nothing: the report of what the run cache holds

Seeds 0-2 come from the campaign's run caches; new runs go to benchmarks/results/soap_seeds_runs.json. Writes
soap_seeds.{md,json,png}.
"""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_report import mean_curve, steps_to
from benchmarks.nanogpt_matrix_runs import (
    ARMS,
    REGIMES,
    RESULTS,
    build,
    follow_up_args,
    job_for,
    perturb,
    records_by_group,
    runs_beside_the_campaign,
)

NAME = "soap_seeds"
MEASURED = ("reference", "data_rich")
FLOOR_REGIME = "reference"  # the floor and the first update: the regime whose SOAP gaps the goals are about
CAMPAIGN_SEEDS, EXTRA_SEEDS = (0, 1, 2), (3, 4, 5)
EXTENDED = ("muon", "soap", "symo_soap_heavyball_gpt_muon", "symo_soap_muon_gpt_muon", "symo_soap_muon_gpt_muon_qkv",
            "symo_soap_gpt_muon", "soap_authors", "symo_soap_muon_gpt_true", "symo_soap_gpt_true")
# (kind, its arm on the true-symmetry spec, its arm on the Muon-style spec): does the group help SOAP
SYMMETRY_PAIRS = (("soap", "symo_soap_gpt_true", "symo_soap_gpt_muon"),
                  ("SOAP-Muon", "symo_soap_muon_gpt_true", "symo_soap_muon_gpt_muon"))
FLOOR_ARM, PERTURBATION = "soap", 1e-7
FLOOR_KEY = f"{FLOOR_ARM}_init_perturbed"
# (label, arm A, arm B, whether B's initial weights are perturbed): first-update pairs
FIRST_UPDATE_PAIRS = (
    ("Muon against itself, initial weights 1e-7 apart", "muon", "muon", True),
    ("heavyball's SOAP against itself, initial weights 1e-7 apart", "soap", "soap", True),
    ("Symo soap_heavyball against heavyball's SOAP, same initial weights", "soap", "symo_soap_heavyball_gpt_muon",
     False),
    ("Symo SOAP-Muon against itself, initial weights 1e-7 apart", "symo_soap_muon_gpt_muon",
     "symo_soap_muon_gpt_muon", True),
)


def tuned(regime: str) -> dict[str, dict]:
    """The campaign's chosen (lr, weight decay) per arm, from its report."""
    return json.loads((RESULTS / "nanogpt_matrix.json").read_text())[regime]["arms"]


def jobs(chosen: dict[str, dict], regime: str) -> list[dict]:
    """Every run the report reads in `regime`: the campaign's seeds and the extra ones per extended arm, then (in
    the floor's regime) the perturbed runs."""
    setup, out = REGIMES[regime], []
    for arm in EXTENDED:
        lr, wd = chosen[arm]["lr"], chosen[arm]["weight_decay"]
        out += [dict(job_for(regime, setup, arm, lr, wd, seed), group=arm) for seed in CAMPAIGN_SEEDS + EXTRA_SEEDS]
    if regime != FLOOR_REGIME:
        return out
    lr, wd = chosen[FLOOR_ARM]["lr"], chosen[FLOOR_ARM]["weight_decay"]
    for seed in CAMPAIGN_SEEDS:
        job = job_for(regime, setup, FLOOR_KEY, lr, wd, seed)
        job.update(group=FLOOR_KEY, arm_config=ARMS[FLOOR_ARM], init_perturbation=PERTURBATION)
        out.append(job)
    return out


def first_update(steps: int = 2, pairs: list[dict] | None = None) -> list[dict]:
    """Per pair, the relative difference of the two runs' displacements of the hidden matrices after `steps`
    steps at the arm's tuned rate (no decay, no schedule) on the reference GPT, seed 0: ||dA - dB|| / ||dA||.
    SOAP's first step only initializes its statistics, so its first update is the second step. `pairs`: dicts with
    the label, the arm names `arm_a`, `arm_b` (for the tuned rates), the arms' configs `config_a`, `config_b`
    (default: the campaign's arms of those names) and whether B's initial weights are `perturbed`."""
    import torch

    torch.set_num_threads(1)
    from symo.train.data import load_corpus
    from symo.train.models import GPT, GPTConfig
    from symo.train.muon import is_hidden_matrix

    setup, chosen, corpus = REGIMES[FLOOR_REGIME], tuned(FLOOR_REGIME), load_corpus(None)
    torch.manual_seed(0)
    init = GPT(GPTConfig(block_size=setup["block_size"], vocab_size=corpus.vocab_size, n_layer=setup["n_layer"],
                         n_head=setup["n_head"], n_embd=setup["n_embd"]))
    batches = [corpus.batch("train", step, setup["batch_size"], setup["block_size"], 0) for step in range(steps)]

    def displacement(arm: dict, lr: float, perturbed: bool) -> torch.Tensor:
        model = copy.deepcopy(init)
        if perturbed:
            perturb(model, PERTURBATION, 0)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if is_hidden_matrix(n, p)}
        opt = build(arm, model, lr, 0.0, setup["adamw_lr"], setup["n_embd"], setup["n_head"])
        for x, y in batches:
            loss = model(x, y)[1]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        params = dict(model.named_parameters())
        return torch.cat([(params[n].detach() - w).flatten().double() for n, w in start.items()])

    if pairs is None:
        pairs = [{"pair": label, "arm_a": a, "arm_b": b, "perturbed": perturbed}
                 for label, a, b, perturbed in FIRST_UPDATE_PAIRS]
    out = []
    for pair in pairs:
        da = displacement(pair.get("config_a") or ARMS[pair["arm_a"]], chosen[pair["arm_a"]]["lr"], False)
        db = displacement(pair.get("config_b") or ARMS[pair["arm_b"]], chosen[pair["arm_b"]]["lr"],
                          pair["perturbed"])
        out.append({**{k: v for k, v in pair.items() if not k.startswith("config_")}, "steps": steps,
                    "relative_difference": float((da - db).norm() / da.norm())})
    return out


def muon_loss_steps_ratio(arm_runs: list[dict], muon_runs: list[dict]) -> float | None:
    """Steps the arm's seed-mean curve takes to Muon's mean final loss, as a ratio of Muon's own."""
    muon_final = mean_std(r["final_val"] for r in muon_runs)[0]
    reach, muon_steps = steps_to(mean_curve(arm_runs), muon_final), steps_to(mean_curve(muon_runs), muon_final)
    return reach / muon_steps if reach is not None and muon_steps else None


def subset_ratios(records: dict[str, dict[int, dict]], arm: str) -> list[float | None]:
    """The campaign's 3-seed `Muon-loss steps` ratio on each of the 20 three-seed subsets of the six seeds (the
    same subset for the arm and for Muon): how much the 3-seed figure moves with the choice of seeds."""
    seeds = CAMPAIGN_SEEDS + EXTRA_SEEDS
    return [muon_loss_steps_ratio([records[arm][s] for s in subset], [records["muon"][s] for s in subset])
            for subset in itertools.combinations(seeds, len(CAMPAIGN_SEEDS))]


def summarize(records: dict[str, dict[int, dict]], chosen: dict[str, dict]) -> dict[str, Any]:
    """Per extended arm over 3 and over 6 seeds: final losses, paired intervals against Muon and heavyball's SOAP,
    and steps to Muon's mean final loss as a ratio of Muon's own (the campaign's `Muon-loss steps`); then the
    floor: heavyball's SOAP from perturbed initial weights against its campaign runs, beside soap_heavyball; and per
    kind of SYMMETRY_PAIRS over six seeds, its run on the true-symmetry spec paired with its run on the Muon-style
    spec."""
    out: dict[str, Any] = {"arms": {}, "floor": None, "symmetry": []}
    for n_seeds, seeds in ((3, CAMPAIGN_SEEDS), (6, CAMPAIGN_SEEDS + EXTRA_SEEDS)):
        if not all(s in records.get(arm, {}) for arm in EXTENDED for s in seeds):
            continue
        muon_runs = [records["muon"][s] for s in seeds]
        muon_final = mean_std(r["final_val"] for r in muon_runs)[0]
        for arm in EXTENDED:
            runs = [records[arm][s] for s in seeds]
            finals = [r["final_val"] for r in runs]
            m, sd = mean_std(finals)
            reach = steps_to(mean_curve(runs), muon_final)
            ratio = muon_loss_steps_ratio(runs, muon_runs)
            entry = out["arms"].setdefault(arm, {"label": ARMS[arm]["label"], "lr": chosen[arm]["lr"],
                                                 "weight_decay": chosen[arm]["weight_decay"]})
            entry[f"seeds_{n_seeds}"] = {
                "finals": dict(zip(map(str, seeds), finals)), "final_val_mean": m, "final_val_std": sd,
                "diff_to_muon_ci95": list(paired_diff_ci95(finals, [r["final_val"] for r in muon_runs])),
                "diff_to_heavyball_soap_ci95": list(paired_diff_ci95(finals, [records["soap"][s]["final_val"]
                                                                                for s in seeds])),
                "muon_final_val_mean": muon_final, "steps_to_muon_final": reach,
                "muon_loss_steps_ratio": ratio}
    for arm, entry in out["arms"].items():
        if "seeds_6" in entry and arm != "muon":
            entry["subset_ratios"] = subset_ratios(records, arm)
    seeds = CAMPAIGN_SEEDS + EXTRA_SEEDS
    for kind, true_arm, muon_style_arm in SYMMETRY_PAIRS:
        if all(s in records.get(arm, {}) for arm in (true_arm, muon_style_arm) for s in seeds):
            true, muon_style = ([records[arm][s]["final_val"] for s in seeds] for arm in (true_arm, muon_style_arm))
            out["symmetry"].append({"kind": kind, "true_arm": true_arm, "muon_style_arm": muon_style_arm,
                                    "seeds": list(seeds), "true_finals": true, "muon_style_finals": muon_style,
                                    "true_minus_muon_style_ci95": list(paired_diff_ci95(true, muon_style))})
    floor = records.get(FLOOR_KEY, {})
    if all(s in floor for s in CAMPAIGN_SEEDS) and all(s in records.get(a, {}) for a in
                                                      (FLOOR_ARM, "symo_soap_heavyball_gpt_muon")
                                                      for s in CAMPAIGN_SEEDS):
        base = [records[FLOOR_ARM][s]["final_val"] for s in CAMPAIGN_SEEDS]
        pert = [floor[s]["final_val"] for s in CAMPAIGN_SEEDS]
        symo = [records["symo_soap_heavyball_gpt_muon"][s]["final_val"] for s in CAMPAIGN_SEEDS]
        out["floor"] = {"perturbation": PERTURBATION, "seeds": list(CAMPAIGN_SEEDS), "heavyball_soap": base,
                        "heavyball_soap_perturbed": pert, "soap_heavyball": symo,
                        "perturbed_minus_heavyball": [p - b for p, b in zip(pert, base)],
                        "perturbed_diff_ci95": list(paired_diff_ci95(pert, base)),
                        "soap_heavyball_minus_heavyball": [s - b for s, b in zip(symo, base)],
                        "soap_heavyball_diff_ci95": list(paired_diff_ci95(symo, base))}
    return out


def markdown(summaries: dict[str, dict[str, Any]], first: list[dict], n_runs: int) -> str:
    lines = [
        "# How far apart the SOAP arms are: six seeds and the run-to-run floor",
        "",
        f"Command: `python -m benchmarks.soap_seeds` ({n_runs} runs; seeds 0-2 of the campaign's arms come from its "
        "run caches)",
        "",
        "The nanoGPT campaign's regimes (benchmarks/nanogpt_matrix.py), each arm at the campaign's tuned rate and "
        "decay. Seeds share initialization and batches across arms. Intervals are paired 95% intervals of the "
        "final validation loss (negative: the row's arm is lower). `Muon-loss steps` = steps the arm's seed-mean "
        "curve takes to reach Muon's mean final loss over the same seeds, as a ratio of Muon's own.",
        "",
        "## The first update",
        "",
        "Relative difference of the hidden matrices' displacement after the first update (SOAP's first step only "
        f"initializes its statistics: two steps), {FLOOR_REGIME} GPT, seed 0, tuned rate, no decay:",
        "",
        "| pair | relative difference |",
        "|---|---|",
        *[f"| {r['pair']} | {r['relative_difference']:.2e} |" for r in first],
    ]
    for regime, summary in summaries.items():
        lines += regime_section(regime, summary)
    return "\n".join(lines + [""])


def regime_section(regime: str, summary: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"## {regime}: three seeds against six",
        "",
        "| arm | lr | wd | seeds | final val | diff to Muon, 95% | diff to heavyball SOAP, 95% | Muon-loss steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    spread = []
    for arm, entry in summary["arms"].items():
        for n in (3, 6):
            e = entry.get(f"seeds_{n}")
            if e is None:
                continue
            d_muon = "-" if arm == "muon" else "[{:+.4f}, {:+.4f}]".format(*e["diff_to_muon_ci95"])
            d_soap = "-" if arm == "soap" else "[{:+.4f}, {:+.4f}]".format(*e["diff_to_heavyball_soap_ci95"])
            ratio = e["muon_loss_steps_ratio"]
            lines.append(f"| {entry['label']} | {entry['lr']:g} | {entry['weight_decay']:g} | {n} | "
                         f"{e['final_val_mean']:.4f} ± {e['final_val_std']:.4f} | {d_muon} | {d_soap} | "
                         f"{'not reached' if ratio is None else f'{ratio:.2f}x'} |")
        if "subset_ratios" in entry:
            spread.append(f"| {entry['label']} | {subset_spread(entry['subset_ratios'])} |")
    if spread:
        lines += ["", "The 3-seed `Muon-loss steps` on each of the 20 three-seed subsets of the six seeds (the arm and "
                  "Muon on the same subset; the campaign's seeds 0-2 are one of them):", "",
                  "| arm | median | range | subsets at or under 0.85x |", "|---|---|---|---|", *spread]
    if summary["symmetry"]:
        lines += ["", f"## {regime}: does the true symmetry help SOAP", "",
                  "Each kind on the true-symmetry spec (gpt_true) and on the Muon-style spec (gpt_muon), each at its "
                  "own tuned rate and decay, six seeds paired (negative: the true symmetry is lower).", "",
                  "| kind | gpt_true | gpt_muon | gpt_true - gpt_muon, paired 95% |", "|---|---|---|---|"]
        for pair in summary["symmetry"]:
            (mt, st), (mm, sm) = mean_std(pair["true_finals"]), mean_std(pair["muon_style_finals"])
            lines.append("| {} | {:.4f} ± {:.4f} | {:.4f} ± {:.4f} | [{:+.4f}, {:+.4f}] |".format(
                pair["kind"], mt, st, mm, sm, *pair["true_minus_muon_style_ci95"]))
    floor = summary["floor"]
    if floor is not None:
        lines += [
            "",
            f"## {regime}: the floor, the same SOAP from initial weights 1e-7 apart",
            "",
            f"heavyball's SOAP at its tuned rate and decay, seeds {', '.join(map(str, floor['seeds']))}, with every "
            f"initial weight multiplied by (1 + {floor['perturbation']:g} N(0, 1)), against the campaign's runs of "
            "the same seeds; beside it, Symo's soap_heavyball against the same runs.",
            "",
            "| runs against heavyball's SOAP | per-seed difference in final loss | paired 95% |",
            "|---|---|---|",
            "| heavyball's SOAP, perturbed | {} | [{:+.4f}, {:+.4f}] |".format(
                ", ".join(f"{d:+.4f}" for d in floor["perturbed_minus_heavyball"]), *floor["perturbed_diff_ci95"]),
            "| Symo soap_heavyball | {} | [{:+.4f}, {:+.4f}] |".format(
                ", ".join(f"{d:+.4f}" for d in floor["soap_heavyball_minus_heavyball"]),
                *floor["soap_heavyball_diff_ci95"]),
        ]
    return lines


def subset_spread(ratios: list[float | None]) -> str:
    """Median, range and the count at or under 0.85x of the subset ratios (a subset that never reaches Muon's
    loss counts as above every ratio)."""
    ranked = sorted(ratios, key=lambda r: float("inf") if r is None else r)
    show = [("not reached" if r is None else f"{r:.2f}x") for r in ranked]
    under = sum(r is not None and r <= 0.85 for r in ratios)
    return f"{show[len(show) // 2]} | {show[0]} to {show[-1]} | {under} of {len(ratios)}"


def plot(out: Path, records: dict[str, dict[str, dict[int, dict]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = CAMPAIGN_SEEDS + EXTRA_SEEDS
    fig, axes = plt.subplots(1, len(records), figsize=(6 * len(records), 4), squeeze=False)
    for ax, (regime, by_arm) in zip(axes[0], records.items()):
        for arm in EXTENDED:
            if all(s in by_arm.get(arm, {}) for s in seeds):
                steps, vals = zip(*mean_curve([by_arm[arm][s] for s in seeds]))
                ax.plot(steps, vals, label=ARMS[arm]["label"])
        low = min((r["final_val"] for runs in by_arm.values() for r in runs.values()), default=1.5)
        ax.set(xlabel="step", ylabel="validation loss (mean of 6 seeds)", ylim=(low - 0.02, low + 0.3),
               title=f"nanoGPT {regime} regime, tuned rate and decay")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    chosen = {regime: tuned(regime) for regime in MEASURED}
    todo = {regime: jobs(chosen[regime], regime) for regime in MEASURED}
    found = runs_beside_the_campaign([job for regime in MEASURED for job in todo[regime]],
                                     RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report, NAME)
    records = records_by_group(todo, found)
    first = first_update()
    summaries = {regime: summarize(records[regime], chosen[regime]) for regime in MEASURED}
    n_runs = sum(len(runs) for by_arm in records.values() for runs in by_arm.values())
    md = markdown(summaries, first, n_runs)
    write_results(args.out, NAME, md, {"first_update": first, "regimes": summaries})
    plot(args.out, records)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
