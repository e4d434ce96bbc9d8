"""Which of SOAP's conventions separates the authors' SOAP from heavyball's on the nanoGPT reference regime.

In benchmarks/results/nanogpt_matrix.md, Symo's `soap` preset (the authors' algorithm and defaults) ends level
with the authors' own SOAP and behind heavyball's SOAP in the reference regime, while `soap_heavyball` (the same
algorithm with heavyball's conventions) ends level with heavyball's. The presets differ in two defaults (beta1
0.95 against 0.9; the eigenbasis refreshed every 10 steps against every 2) and in three details (the refresh
one step earlier, eps as a clamp, a shift in the QR step). This script changes one default at a time on
`soap`, then both, at `soap`'s tuned rate with no weight decay, for the campaign's three seeds (same
initialization and batches), and pairs each variant with `soap` seed by seed:

    python -m benchmarks.soap_gap              # 11 runs of about 10 minutes on 2 workers (about an hour)
    python -m benchmarks.soap_gap --report     # train nothing: the report of what the run cache holds

Runs the campaign already made (`soap` at this point, `soap_heavyball`'s seed 0) are read from its run cache;
new runs go to benchmarks/results/soap_gap_runs.json. Writes soap_gap.{md,json,png}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.harness import RunCache, mean_std, paired_diff_ci95, write_results
from benchmarks.nanogpt_matrix_report import mean_curve, steps_to
from benchmarks.nanogpt_matrix_runs import REGIMES, RESULTS, follow_up_args, job_for, runs_beside_the_campaign

NAME = "soap_gap"
REGIME, LR, WD, SEEDS = "reference", 6e-3, 0.0, (0, 1, 2)
BASE = "symo_soap_gpt_muon"
# variant -> (label, the campaign arm it reuses or None, options over the soap preset)
VARIANTS: dict[str, tuple[str, str | None, dict]] = {
    "soap": ("soap (the authors' conventions)", BASE, {"preset": "soap"}),
    "soap_beta1_0.9": ("soap, beta1 0.9", None, {"preset": "soap", "beta1": 0.9}),
    "soap_refresh_2": ("soap, refresh every 2 steps", None, {"preset": "soap", "precondition_frequency": 2}),
    "soap_both_defaults": ("soap, beta1 0.9 and refresh every 2 (heavyball's defaults, the authors' details)", None,
                           {"preset": "soap", "beta1": 0.9, "precondition_frequency": 2}),
    "soap_heavyball": ("soap_heavyball (all of heavyball's conventions)", "symo_soap_heavyball_gpt_muon",
                       {"preset": "soap_heavyball"}),
}


def jobs(campaign: RunCache) -> list[dict]:
    """Every variant's runs; a run the campaign made carries the campaign's key (read from its cache)."""
    setup, out = REGIMES[REGIME], []
    for variant, (label, arm, options) in VARIANTS.items():
        for seed in SEEDS:
            job = job_for(REGIME, setup, arm, LR, WD, seed) if arm else None
            if job is None or job["key"] not in campaign:
                job = job_for(REGIME, setup, f"soap_gap_{variant}", LR, WD, seed)
                job["arm_config"] = {"kind": "symo", "spec": "gpt_muon", "options": options, "label": label}
            job["variant"] = variant
            out.append(job)
    return out


def summarize(records: dict[str, list[dict]], muon_final: float | None,
              muon_steps: int | None = None) -> tuple[dict, str]:
    """Per variant: the final losses, the paired interval against `soap`, and the steps its seed-mean curve takes
    to Muon's mean final loss (with `muon_steps`, Muon's own, also their ratio, as the campaign reports it)."""
    base = {r["seed"]: r["final_val"] for r in records["soap"]}
    rows, data = [], {}
    for variant, runs in records.items():
        label = VARIANTS[variant][0]
        if len(runs) < len(SEEDS):
            rows.append(f"| {label} | {len(runs)} of {len(SEEDS)} seeds | | |")
            continue
        finals = {r["seed"]: r["final_val"] for r in runs}
        m, s = mean_std(finals.values())
        lo, hi = paired_diff_ci95([finals[k] for k in SEEDS], [base[k] for k in SEEDS])
        reach = steps_to(mean_curve(runs), muon_final) if muon_final is not None else None
        ratio = reach / muon_steps if reach is not None and muon_steps else None
        data[variant] = {"label": label, "final_val_mean": m, "final_val_std": s, "finals": finals,
                         "diff_to_soap_ci95": [lo, hi], "steps_to_muon_final": reach,
                         "steps_to_muon_final_ratio": ratio}
        interval = "" if variant == "soap" else f"[{lo:+.4f}, {hi:+.4f}]"
        steps = "not reached" if reach is None else f"{reach}" + (f" ({ratio:.2f}x)" if ratio is not None else "")
        rows.append(f"| {label} | {m:.4f} ± {s:.4f} | {interval} | {steps} |")
    table = ["| variant | final val (3 seeds) | diff to soap, paired 95% | steps to Muon's final loss (vs Muon's) |",
             "|---|---|---|---|", *rows]
    return data, "\n".join(table)


def plot(out: Path, records: dict[str, list[dict]], muon_final: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, runs in records.items():
        if len(runs) == len(SEEDS):
            steps, vals = zip(*mean_curve(runs))
            ax.plot(steps, vals, label=VARIANTS[variant][0])
    if muon_final is not None:
        ax.axhline(muon_final, color="grey", linestyle=":", label="Muon's mean final loss")
    ax.set(xlabel="step", ylabel="validation loss (mean of 3 seeds)", ylim=(1.5, 1.9),
           title=f"nanoGPT {REGIME} regime, lr {LR:g}, no weight decay")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"{NAME}.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = follow_up_args(__doc__.splitlines()[0], argv)
    campaign = RunCache(RESULTS / f"nanogpt_matrix_{REGIME}_runs.json")
    todo = jobs(campaign)
    found = runs_beside_the_campaign(todo, RunCache(args.out / f"{NAME}_runs.json"), args.workers, not args.report,
                                     NAME)
    records: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for job in todo:
        if job["key"] in found:
            records[job["variant"]].append(found[job["key"]])
    # Muon's tuned configuration and mean final loss, from the campaign's report; its runs from the campaign's cache
    report = RESULTS / "nanogpt_matrix.json"
    tuned = json.loads(report.read_text())[REGIME] if report.is_file() else {}
    muon_final, muon = tuned.get("muon_final"), tuned.get("arms", {}).get("muon")
    muon_steps = None
    if muon_final is not None and muon is not None:
        keys = [job_for(REGIME, REGIMES[REGIME], "muon", muon["lr"], muon["weight_decay"], seed)["key"]
                for seed in SEEDS]
        if all(k in campaign for k in keys):
            muon_steps = steps_to(mean_curve([campaign[k] for k in keys]), muon_final)
    data, table = summarize(records, muon_final, muon_steps)
    md = "\n".join([
        "# SOAP's conventions on nanoGPT: which one separates the authors' SOAP from heavyball's",
        "",
        f"Command: `python -m benchmarks.soap_gap` ({sum(map(len, records.values()))} runs; the `soap` runs and "
        "soap_heavyball's seed 0 come from the campaign's run cache)",
        "",
        f"The nanoGPT campaign's {REGIME} regime (benchmarks/nanogpt_matrix.py): Symo's `soap` preset on the "
        f"gpt_muon spec at its tuned rate {LR:g}, no weight decay, seeds {', '.join(map(str, SEEDS))}; each "
        "variant changes what its row says and nothing else. `diff to soap` is the paired 95% interval of "
        "(variant - soap) final validation loss (negative: better). Steps to Muon's final loss: the seed-mean "
        "curve's first evaluation at or below Muon's tuned mean final loss"
        + (f" ({muon_final:.4f})" if muon_final is not None else "")
        + (f", and as a ratio of the {muon_steps} steps Muon's own seed-mean curve takes (the campaign's "
           "`Muon-loss steps`)." if muon_steps else "."),
        "",
        table,
        "",
    ])
    write_results(args.out, NAME, md, {"regime": REGIME, "lr": LR, "wd": WD, "seeds": list(SEEDS),
                                       "muon_final_val_mean": muon_final, "muon_steps_to_its_final": muon_steps,
                                       "variants": data})
    plot(args.out, records, muon_final)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
