"""Acceptance check for ``stallscope tune``: its confirmed winner against the best of a full grid.

Runs the reference script from a poor configuration (0 workers, no persistent workers, short
epochs so worker restarts matter), then:
1. ``tune`` with at most a third of the grid's distinct configurations as runs (confirmation included);
2. every distinct configuration of the grid num_workers x prefetch_factor x persistent_workers,
   measured the same way (same steps, same warm-up discarding);
3. the printed change re-run twice with ``stallscope run --set ...``, to show it reproduces.
It prints the tune winner's confirmed rate, the grid's best, their ratio and the runs each used.

    .venv/bin/python benchmarks/tune_grid.py --data ~/.cache/stallscope/datasets/imagefolder-500x400-9594901ea6

Measured 2026-11-30 on the 2-core machine with --steps 100: tune used 8 runs (0.32 of the 25-configuration
grid) and its winner was the grid's best configuration (num_workers=2, persistent_workers=True,
prefetch_factor=1): confirmed 525.4 samples/s against the grid's 580.5 (0.905, the grid's figure being the
best of 25 noisy runs), and 0.988 head to head (medians of 3 alternating runs each). With --steps 40 the
per-trial noise (+-10-15%) let tune settle on 2 workers alone (head to head 0.81-0.92).

2026-12-04 (session 30, at 4dceb03: the time-sharing cost from the workers' page faults, unchanged for this JPEG
pipeline), --steps 100, 7 min: **met**. tune used 8 runs (0.32 of the grid): original 174.9 (its first run; 466.0 in
the confirmation, 434.4 in the grid), diagnosis 3 workers persistent prefetch 1 437.1, 2 workers 468.0, 4/1 workers
432.4/393.6, 2 restarted 404.5; winner 2 workers persistent prefetch 1 (511.5 +- 18.9 in the grid), confirmed 476.5 +-
16.3; the grid's best single run 3 workers persistent prefetch 1, 518.9 +- 16.8: 0.918, **1.136 head to head** (537.0
vs 472.8); the reproduce line measured 523.4 and 472.5.

2026-12-04 (session 29, at f7df250: a trial's standard error from its blocks' time per sample, not their rates),
--steps 100, 10 min: **met**. tune used 8 runs (0.32 of the grid): original 435.0, diagnosis 2 workers persistent
prefetch 1 593.1, 3/4/1 workers 513.8/517.9/398.7, 2 restarted 457.7; winner the diagnosis, which is the grid's best
configuration (625.8 +- 7.0 in the grid), confirmed 554.1 +- 9.2 against the original's 491.2: 0.885 of the grid's
single best run, **0.968 head to head** (598.5 vs 618.3); the reproduce line measured 587.8 and 601.8.

2026-12-03 (session 24), --steps 100, three runs, one change each. **Met in the last.**
1. At 3c210bd (a diagnosis that predicted 1.10x or more and tied the incumbent runs once more, the mean of both runs
   deciding): original 347.6; diagnosis 2 workers persistent 326.9, again 368.8, over both 347.9: not past the original;
   the climb from 0 (1: 266.9, 2: 372.0) and a 1-worker trial's diagnosis (320.9); pick 2 workers (the fastest, 7% up),
   confirmed 359.6 against the grid's best single run, 2 workers persistent prefetch 1, 457.8: 0.786, **0.928 head to
   head** (340.5 vs 367.1). Here 2 workers persistent at prefetch 2 measured 317.6 in the grid, 2 at prefetch 1 457.8.
2. At 893985e (the worker advice comes with ``prefetch_factor=1`` where the loop leaves its epochs early: 2 workers
   kept alive, one batch each in flight, 1.36x predicted against 1.28x in the first run's grid): the diagnosis was the
   grid's best configuration (399.4 against the original's 256.5); then 3/4/1 workers 430.0/384.8/292.3 and 2 restarted
   340.5; the final pick took the fastest, 3 workers (430.0 +- 15.0 against 399.4 +- 18.1, 1.3 combined standard
   errors), confirmed 414.9 against the grid's best, 2 workers persistent prefetch 1, 453.4: 0.915, **0.839 head to
   head** (447.9 vs 534.0). Not met.
3. At fbd3e2f (a configuration tried blind displaces the diagnosis' as the final pick only past z = 2 standard errors,
   as in the climb): original 318.7; diagnosis 2 workers persistent prefetch 1, 434.9; 3/4/1 workers 407.9/358.2/328.3,
   2 restarted 355.8; winner the diagnosis, confirmed 447.0 (original 343.9, 1.30x) against the grid's best single run,
   2 workers persistent prefetch 2, 465.0 +- 27.6 (its prefetch 1 twin 461.7): **0.961 in 8 runs (0.32 of the grid),
   1.024 head to head** (398.0 vs 388.8). The reproduce line measured 449.0 and 444.6.

2026-12-03 (session 23, at 04ec143: a new worker's warm-up priced at every epoch start), --steps 100, a drifting
machine, two runs, **not met** in either. First: the diagnosis trial (2 workers persistent, 315.0) did not beat the
original (316.1), so tune climbed from 0 workers (1: 252.3, 2: 276.6), followed a 1-worker trial's diagnosis (prefetch
1: 264.0) and kept the original after 5 runs; the grid's best single run, 3 workers persistent prefetch 1, 379.7:
0.832, **0.913 head to head** (309.0 vs 338.6). Second (``--store /tmp/s23/gstore``): original 253.8, diagnosis 2
workers persistent 328.0, its diagnosis prefetch 1 333.4 (within the noise, so not the incumbent), 3/4/1 workers
persistent 299.8/265.4/218.1; winner 2 workers persistent, confirmed 277.3 against the grid's best single run, 4
workers persistent prefetch 1, 418.3: 0.663, **0.938 head to head** (266.0 vs 283.7). The model's chain is session
22's (2 workers kept alive, then prefetch 1); the same configuration measured 328.0 and 277.3 in one tune.

2026-12-03 (session 22, at b23123c: the load costs from the runs' own CPU per sample), --steps 100, a drifting machine
(the original measured 305.7 in tune's first run, 343.9 in its confirmation and 360.8 in the grid), 9 min: **met**.
tune used 8 runs (0.32 of the grid): original, its diagnosis' 2 persistent workers (324.9), 3 (295.1), 4 (235.9), 1
(297.6), then that trial's diagnosis' prefetch 1 (420.8); its winner, 2 workers persistent prefetch 1, confirmed
409.6 against the grid's best single run, 4 workers persistent prefetch 1 at 392.0 (the grid's own run of tune's
winner: 381.7): 1.045, and **1.163 head to head** (medians of 3 alternating runs: 348.7 vs 299.7). The reproduce line
measured 343.5 and 373.8.

2026-12-03 (session 20, at ec8954e: the compute's time-sharing cost and spin-is-not-load), --steps 100, quiet machine:
**met**. tune used 8 runs (0.32 of the 25-configuration grid); its winner IS the grid's best configuration (2 workers,
persistent, prefetch 1): confirmed 493.2 samples/s against the grid's 511.9 (0.963 against the best of 25 single runs),
**0.988 head to head** (medians of 3 alternating runs: 484.8 vs 490.5).

2026-12-01, --steps 100, quiet machine, 7 min 43 s: tune used 8 runs (0.32 of the 25-configuration grid), winner
num_workers=3, persistent_workers=True, prefetch_factor=1, confirmed 318.6 samples/s against the grid's best (2
workers, persistent, prefetch 1) 403.6: 0.790 against the best of 25 single runs, but **1.077 head to head** (medians
of 3 alternating runs each: 366.3 vs 340.2). The machine's drift dwarfed the configurations: the original (0 workers)
measured 220.1 in tune's first run and 343.6 in its confirmation, and 339.5 in the grid.

2026-12-02 (session 19, at 3b0a5ff: also, a trial whose standard error is a quarter of its rate or more never takes the
final pick, and the original's run not kept takes no part), --steps 100, about 10 min: **met**. tune used 8 runs (0.32
of the grid): original (366.3), its diagnosis' 2 persistent workers (438.4), that trial's diagnosis' prefetch 1 (469.0),
3 workers (453.1), 4 (420.4), 1 (344.2); its winner IS the grid's best configuration (2 workers, persistent, prefetch
1): confirmed 431.9 against the grid's 466.7 (0.925 against the best of 25 single runs), **1.002 head to head**
(medians of 3 alternating runs, 463.0 vs 462.0). The machine ran this grid 1.7x as fast as the run below.

2026-12-02 (session 19: a loaded original runs again, the worker climb looks one count past one that did not pay,
6a78dfa), --steps 100, about 11 min: tune used 8 runs (0.32 of the grid): original, the diagnosis' 2 workers, its
diagnosis' persistent workers with prefetch 1 (the grid's best configuration, 249.3 samples/s in its one run), then 3
workers (258.1) and 4 (241.3) and 1 (188.0); its pick is the fastest measured, 3 workers persistent prefetch 1, 3.5%
above the grid's best configuration in one run each (within their noise). Confirmed 244.2 against the grid's best (2
workers, persistent, prefetch 1) 279.3: 0.874; **0.942 head to head** (medians of 3 alternating runs, 262.1 vs 278.4;
rounds 0.87, 0.92, 0.98). Not met by 0.8 points: the search found the grid's best and its final pick between two
configurations within noise took the other one. The original measured 171.2 in its run and 220.6 in its confirmation.

2026-12-02 (session 18, with the queueing term, c726a39), --steps 100, about 10 min: **not met**. tune used 2 runs and
kept the original (0 workers): confirmed 223.1 samples/s against the grid's best (4 workers, persistent, prefetch 1)
298.5, 0.890 head to head (medians 227.7 vs 255.8). Its original's recording saw other programs keep 0.42 of the 2 CPUs
busy (a whole core for 2.6 s of its 7 steady seconds; the next trial 0.98), so the model planned for 1.58 CPUs, and
no worker count gained enough over the short epochs' worker restarts to be advised: the advice was the transform and
decode fixes alone, and tune's one candidate, 1 worker, measured slower. The same recording with the queueing term
taken out advises the same (it is the load, not the term). Without a worker count to climb from, tune climbed no
further; the grid's persistent configurations were never tried.

2026-12-02 (session 14), --steps 100, quiet machine, 6 min 42 s: tune used 8 runs (0.32 of the grid); its winner IS
the grid's best configuration (2 workers, persistent, prefetch 1): confirmed 393.8 samples/s against the grid's 454.7
(0.866 against the best of 25 single runs), **1.042 head to head** (medians of 3 alternating runs: 399.4 vs 383.3).

2026-12-02 (session 15, CPU seconds priced at each configuration's load), --steps 100, quiet machine, 5 min 30 s:
tune used 8 runs (0.32 of the grid); its winner IS the grid's best configuration (2 workers, persistent, prefetch 1):
0.948 against the grid's best single run (588.6 samples/s), **0.987 head to head** (medians of 3 alternating runs:
570.7 vs 577.9).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from stallscope.session import Session
from stallscope.tuning import tune
from stallscope.tuning.search import config_key
from stallscope.tuning.trials import measured_rate, normalize, run_trial

REFERENCE = Path(__file__).resolve().parent.parent / "src" / "stallscope" / "demo" / "reference_train.py"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workers", default="0,1,2,3,4")
    p.add_argument("--prefetch", default="1,2,4")
    p.add_argument("--store", default=None)
    p.add_argument("--head-to-head", type=int, default=3, help="alternating re-runs of both winners")
    a = p.parse_args()
    store = Path(a.store or tempfile.mkdtemp(prefix="tune-grid-"))
    command = [sys.executable, str(REFERENCE), "--data", a.data, "--workers", "0", "--threads", "1",
               "--batch-size", "16", "--image-size", "128", "--max-batches", "10", "--epochs", "1000"]
    grid = {}
    for w, pf, pw in itertools.product([int(x) for x in a.workers.split(",")],
                                       [int(x) for x in a.prefetch.split(",")], [False, True]):
        cfg = normalize({"num_workers": w, "prefetch_factor": pf, "persistent_workers": pw})
        grid.setdefault(config_key(cfg), cfg)
    budget = len(grid) // 3
    print(f"command: {' '.join(command)}")
    print(f"grid: {len(grid)} distinct configurations; tune may use {budget} runs, confirmation included\n")

    result = tune(command, trials=budget, steps=a.steps, store=store,
                  on_done=lambda t: print(f"  tune {t.index:>2} {t.label:<18} {t.overrides} "
                                          f"{t.rate.value if t.rate else t.reason}", flush=True))
    w = result.winner_confirmed
    print(f"tune: {result.runs} runs; winner {result.winner_overrides or '(original)'} confirmed "
          f"{w.value:.1f} ± {w.se:.1f} samples/s vs original {result.original_confirmed.value:.1f}\n")

    rows = []
    for i, cfg in enumerate(grid.values(), 1):
        overrides = {k: v for k, v in cfg.items() if k in ("num_workers", "prefetch_factor", "persistent_workers")
                     and (cfg["num_workers"] > 0 or k == "num_workers")}
        t = run_trial(command, overrides, index=i, label="grid", trial_dir=store / "grid" / f"{i:02d}", store=store,
                      steps=a.steps, timeout_s=300)
        rows.append((overrides, t))
        print(f"  grid {i:>2} {overrides} {f'{t.rate.value:.1f} ± {t.rate.se:.1f}' if t.ok else t.reason}", flush=True)
    best_overrides, best = max(((o, t) for o, t in rows if t.ok), key=lambda ot: ot[1].rate.value)
    print(f"\ngrid best: {best_overrides} {best.rate.value:.1f} ± {best.rate.se:.1f} samples/s ({len(rows)} runs)")
    print(f"tune confirmed / grid best = {w.value / best.rate.value:.3f} using {result.runs} runs "
          f"({result.runs}/{len(rows)} = {result.runs / len(rows):.2f} of the grid)")

    # The grid's best is the maximum of many noisy runs, which overstates its true rate (the
    # winner's curse). Measure both winners again, alternating, so drift and luck hit both alike.
    tune_overrides = dict(result.winner_overrides or {})
    same = config_key(normalize(tune_overrides)) == config_key(normalize(best_overrides))
    print(f"\nhead to head ({a.head_to_head} alternating runs each; tune's winner "
          f"{'IS' if same else 'is not'} the grid's best configuration):")
    pairs: dict[str, list[float]] = {"tune": [], "grid": []}
    for k in range(a.head_to_head):
        order = [("tune", tune_overrides), ("grid", best_overrides)]
        for name, overrides in order if k % 2 == 0 else reversed(order):
            t = run_trial(command, overrides, index=k, label=f"h2h-{name}", trial_dir=store / "h2h" / f"{name}-{k}",
                          store=store, steps=a.steps, timeout_s=300)
            if t.ok:
                pairs[name].append(t.rate.value)
        print(f"  round {k}: tune {pairs['tune'][-1:]} grid {pairs['grid'][-1:]}", flush=True)
    if pairs["tune"] and pairs["grid"]:
        ratio = statistics.median(pairs["tune"]) / statistics.median(pairs["grid"])
        print(f"head to head: tune's winner {statistics.median(pairs['tune']):.1f} vs grid's best "
              f"{statistics.median(pairs['grid']):.1f} samples/s (medians): ratio {ratio:.3f}")

    print("\nreproduce: " + " ".join(result.rerun_command()))
    for k in range(2):
        out = store / f"reproduce-{k}.json"
        cmd = [sys.executable, "-m", "stallscope", "run", "--quiet", "--json", str(out), "--store", str(store),
               "--steps", str(a.steps), *result.set_args(), "--", *command]
        subprocess.run(cmd, check=False, capture_output=True)
        summary = json.loads(out.read_text())
        train = next(ld for ld in summary["loaders"] if ld["role"] == "train")
        rate, _unit, _d = measured_rate(Session.load(summary["session"]), normalize(train["config"]))
        print(f"  stallscope run {' '.join(result.set_args())}: {rate.value:.1f} ± {rate.se:.1f} samples/s "
              f"(summary JSON: {summary['throughput']['samples_per_s']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
