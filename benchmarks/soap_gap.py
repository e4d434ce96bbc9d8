"""SOAP's conventions and settings, one change at a time, on the nanoGPT reference regime.

The studies and why each was run: benchmarks/soap_gap_studies.py. This module runs them beside the campaign and
reports them.

    python -m benchmarks.soap_gap              # 98 runs of 6-10 minutes on 2 workers (about 8 h)
    python -m benchmarks.soap_gap --report     # train nothing: the report of what the run cache holds

Runs the campaign already made (the soap and soap_muon studies' bases, `soap_heavyball`'s seed 0, heavyball's SOAP
at its tuned decay) are read from its run cache; a variant two studies name is one run; new runs go to
benchmarks/results/soap_gap_runs.json. Writes soap_gap.{md,json,png}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_report import mean_curve, steps_to
from benchmarks.nanogpt_matrix_runs import REGIMES, RESULTS, follow_up_args, job_for, runs_beside_the_campaign
from benchmarks.soap_gap_studies import EXTRA_SEEDS, REGIME, SEEDS, SIX_SEEDS, STUDIES, Study, six_seeded

NAME = "soap_gap"


def jobs(campaign: RunCache) -> list[dict]:
    """Every study's runs; a run the campaign made carries the campaign's key (read from its cache)."""
    setup, out = REGIMES[REGIME], []
    for study_name, study in STUDIES.items():
        for variant, (label, arm, options) in study.variants.items():
            wd = study.wds.get(variant, study.wd)
            for seed in SEEDS + (EXTRA_SEEDS if six_seeded(study_name, variant) else ()):
                job = job_for(REGIME, setup, arm, study.lr, wd, seed) if arm else None
                if options is not None and (job is None or job["key"] not in campaign):
                    job = job_for(REGIME, setup, f"soap_gap_{variant}", study.lr, wd, seed)
                    job["arm_config"] = {"kind": "symo", "spec": study.specs.get(variant, study.spec),
                                         "options": options, "label": label}
                job["study"], job["variant"] = study_name, variant
                out.append(job)
    return out


def summarize(study: Study, records: dict[str, list[dict]], muon_final: float | None,
              muon_steps: int | None = None) -> tuple[dict, str]:
    """Per variant of `study`: the final losses, the paired interval against the study's base, and the steps its
    seed-mean curve takes to Muon's mean final loss (with `muon_steps`, Muon's own, also their ratio, as the
    campaign reports it)."""
    records = {v: [r for r in runs if r["seed"] in SEEDS] for v, runs in records.items()}
    base = {r["seed"]: r["final_val"] for r in records[study.base]}
    rows, data = [], {}
    for variant, runs in records.items():
        label = study.variants[variant][0]
        if len(runs) < len(SEEDS) or len(base) < len(SEEDS):
            rows.append(f"| {label} | {len(runs)} of {len(SEEDS)} seeds | | |")
            continue
        finals = {r["seed"]: r["final_val"] for r in runs}
        m, s = mean_std(finals.values())
        lo, hi = paired_diff_ci95([finals[k] for k in SEEDS], [base[k] for k in SEEDS])
        reach = steps_to(mean_curve(runs), muon_final) if muon_final is not None else None
        ratio = reach / muon_steps if reach is not None and muon_steps else None
        data[variant] = {"label": label, "final_val_mean": m, "final_val_std": s, "finals": finals,
                         "diff_to_base_ci95": [lo, hi], "steps_to_muon_final": reach,
                         "steps_to_muon_final_ratio": ratio}
        interval = "" if variant == study.base else f"[{lo:+.4f}, {hi:+.4f}]"
        steps = "not reached" if reach is None else f"{reach}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
        rows.append(f"| {label} | {m:.4f} ± {s:.4f} | {interval} | {steps} |")
    table = [f"| variant | final val (3 seeds) | diff to {study.base}, paired 95% | steps to Muon's final loss "
             "(vs Muon's) |", "|---|---|---|---|", *rows]
    return data, "\n".join(table)


def six_seeds(study: Study, variant: str, records: dict[str, list[dict]], seeds_cache: RunCache,
              muon: dict[int, dict]) -> tuple[dict, str] | None:
    """`variant` against its study's base and Muon over seeds 0-5 (Muon's seeds 3-5 from soap_seeds' run cache, and
    the base's where it is a campaign arm; else they are in `records`, run here): final losses, paired intervals,
    and the steps each seed-mean curve takes to Muon's six-seed mean final loss as a ratio of Muon's own (the
    campaign's `Muon-loss steps`, on six seeds). None until every run is there."""
    seeds = SEEDS + EXTRA_SEEDS
    arm = study.variants[study.base][1]
    base = {r["seed"]: r for r in records[study.base]}
    if arm is not None:
        base |= {s: seeds_cache[k] for s in EXTRA_SEEDS
                 if (k := job_for(REGIME, REGIMES[REGIME], arm, study.lr, study.wd, s)["key"]) in seeds_cache}
    runs = {"muon": muon, study.base: base, variant: {r["seed"]: r for r in records[variant]}}
    labels = {"muon": "Muon", study.base: study.variants[study.base][0], variant: study.variants[variant][0]}
    if any(set(by_seed) != set(seeds) for by_seed in runs.values()):
        return None
    muon_final = mean_std(muon[s]["final_val"] for s in seeds)[0]
    muon_steps = steps_to(mean_curve(list(muon.values())), muon_final)
    rows, data = [], {}
    for name, by_seed in runs.items():
        finals = [by_seed[s]["final_val"] for s in seeds]
        m, sd = mean_std(finals)
        reach = steps_to(mean_curve(list(by_seed.values())), muon_final)
        intervals = [paired_diff_ci95(finals, [other[s]["final_val"] for s in seeds])
                     for other in (muon, base)]
        data[name] = {"label": labels[name], "final_val_mean": m, "final_val_std": sd,
                      "diff_to_muon_ci95": list(intervals[0]), "diff_to_base_ci95": list(intervals[1]),
                      "muon_loss_steps_ratio": None if reach is None else reach / muon_steps}
        cells = ["" if other is by_seed else f"[{lo:+.4f}, {hi:+.4f}]"
                 for other, (lo, hi) in zip((muon, base), intervals)]
        steps = "not reached" if reach is None else f"{reach / muon_steps:.2f}x"
        rows.append(f"| {labels[name]} | {m:.4f} ± {sd:.4f} | {cells[0]} | {cells[1]} | {steps} |")
    from_seeds = "of the base and of Muon" if arm is not None else "of Muon"
    table = [f"Six seeds ({', '.join(map(str, seeds))}; seeds 3-5 {from_seeds} from "
             f"benchmarks/soap_seeds.py's runs; Muon's six-seed mean final loss {muon_final:.4f}):", "",
             f"| arm | final val (6 seeds) | diff to Muon, 95% | diff to {study.base}, 95% | Muon-loss steps |",
             "|---|---|---|---|---|", *rows]
    return data, "\n".join(table)


def plot(out: Path, records: dict[str, dict[str, list[dict]]], muon_final: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(STUDIES) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[len(STUDIES):]:
        ax.set_visible(False)
    for ax, (study_name, study) in zip(axes.flat, STUDIES.items()):
        for variant, runs in records[study_name].items():
            runs = [r for r in runs if r["seed"] in SEEDS]  # the curves of the three-seed tables
            if len(runs) == len(SEEDS):
                steps, vals = zip(*mean_curve(runs))
                ax.plot(steps, vals, label=study.variants[variant][0])
        if muon_final is not None:
            ax.axhline(muon_final, color="grey", linestyle=":", label="Muon's mean final loss")
        ax.set(xlabel="step", ylabel="validation loss (mean of 3 seeds)", ylim=(1.5, 1.9),
               title=f"{study_name}: lr {study.lr:g}, weight decay {study.wd:g}")
        ax.legend(fontsize=7)
    fig.suptitle(f"nanoGPT {REGIME} regime")
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the suptitle
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def muon_runs(campaign: RunCache, seeds_cache: RunCache) -> dict[int, dict]:
    """Muon's runs at its tuned rate and decay by seed: 0-2 from the campaign's cache, 3-5 from soap_seeds'."""
    muon = json.loads((RESULTS / "nanogpt_matrix.json").read_text())[REGIME]["arms"]["muon"]
    keys = {s: job_for(REGIME, REGIMES[REGIME], "muon", muon["lr"], muon["weight_decay"], s)["key"]
            for s in SEEDS + EXTRA_SEEDS}
    return {s: (campaign if s in SEEDS else seeds_cache)[k] for s, k in keys.items()
            if k in (campaign if s in SEEDS else seeds_cache)}


def muon_reference(campaign: RunCache) -> tuple[float | None, int | None]:
    """Muon's tuned mean final loss (the campaign's report) and the steps its seed-mean curve takes to it (its runs
    from the campaign's cache)."""
    report = RESULTS / "nanogpt_matrix.json"
    tuned = json.loads(report.read_text())[REGIME] if report.is_file() else {}
    muon_final, muon = tuned.get("muon_final"), tuned.get("arms", {}).get("muon")
    if muon_final is None or muon is None:
        return muon_final, None
    keys = [job_for(REGIME, REGIMES[REGIME], "muon", muon["lr"], muon["weight_decay"], seed)["key"] for seed in SEEDS]
    if not all(k in campaign for k in keys):
        return muon_final, None
    return muon_final, steps_to(mean_curve([campaign[k] for k in keys]), muon_final)


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    campaign = RunCache(RESULTS / f"nanogpt_matrix_{REGIME}_runs.json")
    todo = jobs(campaign)
    found = runs_beside_the_campaign(todo, RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report,
                                     NAME)
    records = {name: {v: [] for v in study.variants} for name, study in STUDIES.items()}
    for job in todo:
        if job["key"] in found:
            records[job["study"]][job["variant"]].append(found[job["key"]])
    muon_final, muon_steps = muon_reference(campaign)
    n_runs = len({job["key"] for job in todo if job["key"] in found})  # a run two studies share counts once
    md = [
        "# SOAP's conventions and settings on nanoGPT, one change at a time",
        "",
        f"Command: `python -m benchmarks.soap_gap` ({n_runs} runs; the soap and soap_muon studies' base "
        "runs, soap_heavyball's seed 0 and heavyball's SOAP at its tuned decay come from the campaign's run cache)",
        "",
        f"The nanoGPT campaign's {REGIME} regime (benchmarks/nanogpt_matrix.py), the gpt_muon spec unless a row "
        f"names another, seeds {', '.join(map(str, SEEDS))}; each variant changes what its row says and nothing "
        "else. `diff to base` is the paired 95% interval of (variant - base) final validation loss (negative: "
        "better). Steps to Muon's final loss: the seed-mean curve's first evaluation at or below Muon's tuned mean "
        "final loss"
        + (f" ({muon_final:.4f})" if muon_final is not None else "")
        + (f", and as a ratio of the {muon_steps} steps Muon's own seed-mean curve takes (the campaign's "
           "`Muon-loss steps`)." if muon_steps else "."),
    ]
    data = {}
    seeds_cache = RunCache(RESULTS / "soap_seeds_runs.json")
    for name, study in STUDIES.items():
        study_data, table = summarize(study, records[name], muon_final, muon_steps)
        data[name] = {"lr": study.lr, "wd": study.wd, "base": study.base, "variants": study_data}
        md += ["", f"## {study.title} (`{study.base}` at lr {study.lr:g}, weight decay {study.wd:g})", "", table]
        if name in SIX_SEEDS:
            six = six_seeds(study, SIX_SEEDS[name], records[name], seeds_cache, muon_runs(campaign, seeds_cache))
            if six is not None:
                data[name]["six_seeds"] = six[0]
                md += ["", six[1]]
    md = "\n".join(md) + "\n"
    write_results(args.out, NAME, md, {"regime": REGIME, "seeds": list(SEEDS), "muon_final_val_mean": muon_final,
                                       "muon_steps_to_its_final": muon_steps, "studies": data})
    plot(args.out, records, muon_final)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
