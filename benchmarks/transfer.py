"""Does a plan hold on the machine it was made for? Record on one core count, plan for another, measure there.

For each scenario: record its baseline with the CPU affinity cut to ``--record-cores`` cores, project that
run with ``stallscope plan``'s model (``analysis/plan.py``) to ``--plan-cores`` cores for each ``--workers``
count, then run each planned configuration (``--set num_workers=W``) with the affinity set to
``--plan-cores`` cores, and compare. Then the reverse: record on ``--plan-cores``, plan for and measure on
``--record-cores``. The compared figure is the speedup over the recorded baseline (planned rate on the
target over the model's rate for the recorded run, against measured over measured), as every prediction
of stallscope is a ratio of the model's rates; the absolute planned samples/s are printed beside it. The baseline
and its planned runs are repeated ``--rounds`` times (2 by default), the planned ones in the other order every second
round, and the medians of the rounds' predictions and measured speedups are compared: on a shared or virtual machine
one 40-step run can be 15-40% off the next of the same configuration. Each round's speedups are over the geometric
mean of its baseline and the next one (the last round's: the baseline run once more, unless ``--no-again``); how
far each moved from the one before is printed as the machine's drift.

Every session is kept under ``--out`` with ``results.json``, so ``--rescore OUT`` re-plans from the saved
recordings with the model as it is now, without running anything.

Run:   python benchmarks/transfer.py --out /tmp/transfer [--rounds 2] [--workers 1 2 3] [--steps 40] [--only tokenize ...]
Score: python benchmarks/transfer.py --rescore /tmp/transfer

Needs at least ``--plan-cores`` CPUs in this process's affinity (2 by default, as on the development machine).

On a GPU machine (issue 16, acceptance 4): ``--only GPU --directions up --record-cores 2 --plan-cores 16 --workers 4 8
14`` records the reference training with its model on the GPU (``GPU images``: JPEG decode and augmentation in the
workers, pinned non-blocking copies) on 2 cores and checks the plan for all 16 (``gpu_check.sh`` runs it). Its dataset
is the demo's with 600 JPEGs of about 500x400, repeated 8 times per epoch so that 14 persistent workers are not
refilling their queues at every epoch's start. Without a GPU the scenario trains on the CPU.

Measured 2026-12-04 (session 30, at 302aa89: a worker's time-sharing cost from the page faults its fetches took,
``worker_sharing_cost``), both directions on a quiet machine (the probe read 1.89-2.03): ``--directions down --rounds 3
--out /tmp/s30/tr``, 18 min: **2 -> 1 cores median 3%, worst 11%, all 18 within 20%** (starved +6/+4/+11% for 1/2/3
workers on one core, slow storage +0/+4/+5%, large JPEGs +3/-4/+0%, tokenize +2/-3/+0%, the 2-thread compute
-2/-7/-5%, heavy model +1/+2/+2%); ``--directions up --rounds 2 --out /tmp/s30/trup``, 10 min: **1 -> 2 cores median
2%, worst 9%, all 18 within 10%** (large JPEGs' 2 workers -9%). The model before it, rescored on the same runs: down
median 4%, worst 11%, tokenize 2 and 3 workers -8/-5% (the only rows that moved: the JPEG pipelines take 35-73
thousand faults per CPU second and keep the full cost, the tokenizer about 1,100 and pays 2.3%); up the same but
tokenize +5/-1/-2% (now +4/-2/+1%). So session 28's -25/-22% for tokenize down was mostly that day's slow 2-core
recordings (271-364 samples/s; today's 415-425) and the rest the 8% the tokenizer was charged and does not pay: by
hand, a plain DataLoader on one core, 2 rounds, its worker's CPU per sample with 2 and 3 workers was +1-3% and +4%
over 1 worker, where 500x400 JPEGs paid +6-9% and +14% and 2000x1500 ones +1-9% and +6-10%.

Measured 2026-12-04 (session 28, later: a compute recorded with more intra-op threads than CPUs is planned from its
one-thread time, ``OVERSUBSCRIBED_THREAD_COST``). The up direction at d8b8444, ``--directions up --rounds 2 --out
/tmp/s28/trup``, 10 min: **1 -> 2 cores median 4%, worst 21%**: every row within 10% but the 2-thread compute's
(-6/-21/-11%: 2 threads recorded on one CPU, cut to 1 beside 1-3 workers on two, planned 1.19x/1.34x/1.30x, measured
1.26x/1.71x/1.47x). Its recorded compute held the threads' waits for the one CPU: by hand, 40 steps, 0 workers, the
reference training's compute per sample on one CPU was 0.74-0.81 ms on 1 thread, 1.19-1.23 on 2, 1.80-1.91 on 3, 2.49 on
4; on two CPUs 0.76 on 1, 0.48 on 2, 1.04 on 3, 1.66 on 4; the plan had taken the 2-thread time for the one-thread one.
Rescored with the change: **up median 3%, worst 10%** (the 2-thread rows -2/-10/+1%, the other 15 unchanged); the down
runs above unchanged (none recorded so). Run live after it, ``--only 2-thread --rounds 2 --out /tmp/s28/tr2t``: up
-5/+0/+1% (the model before it, rescored on the same runs: -8/-12/-11%), down +6/+8/+7%.

Measured 2026-12-04 (session 28, at d8b8444, the model unchanged since e92f2ce), down only, all six scenarios,
``--directions down --rounds 2 --out /tmp/s28/tr``, 10 min: **2 -> 1 cores median 8%, worst 22%, three rows outside 20%:
not met.** Starved +20/+12/+4% (1/2/3 workers), the 2-thread compute +14/+8/+10%, tokenize -9/-20/-22%, large JPEGs
-5/-11/-4%, slow storage +1/+0/+8%, heavy model -0/-6/-0%. The misses go both ways, and each run's own figures say why:
the 500x400 JPEG pipeline's workers on one core cost 9-28% more CPU per sample than planned (its transform +30% over the
in-process recording), while the tokenizing worker cost 11-27% less than in its 2-core recording (2.5-2.9 ms against
2.9-3.25 ms, its training process waiting 2.8-3.3 ms per sample there for the worker's hand-over, 0.2-0.9 ms on one
core), and large JPEGs' matched the plan (-14..+1%). Tried offline (``--rescore``) and not kept: the compute-neighbour
cost on a single core too (the training step evicting the workers' caches between their slices): starved +15/+8/-0%,
2-thread +12/+5/+7%, tokenize -10/-21/-23%, large JPEGs -7/-13/-6%: median 7%, worst 23%. One load term cannot move both
signs; the baseline again moved -15..+31% between runs (starved's two 2-core recordings 255 and 336 samples/s), the
probe read 1.56-2.16. Run again with ``--rounds 4 --out /tmp/s28/tr4`` (21 min, same code): **down median 4%, worst
25%**: starved +3/+9/+4%, the 2-thread compute +6/-1/+6%, slow storage +0/+4/+10%, large JPEGs -3/-4/-2%, heavy model
-4/-3/-3%, all within 10%; tokenize -12/**-25/-22%** the two rows outside 20% (0.87x and 0.88x planned for 2 and 3
workers on one core, rounds 1.11-1.23x). So starved's over-prediction was mostly the machine's noise (the baseline moved
-26..+23%; the probe read 1.37-2.23), and tokenize's is the model's: the same scenario by hand on a quiet machine right
after, plain torch and under stallscope, ran at 386-438 samples/s with 1 worker on two cores and with 1 or 2 on one, the
worker's CPU per sample 2.25-2.49 ms in all of them. The plan charges 2 and 3 workers on one core the 8% time-sharing
cost (``TIME_SHARING_COST``): rescored with it at 0, tokenize 2 and 3 workers are 0.94x and 0.95x (-19%, -16%; starved's
rows then +6/+16/+11%). A pure-Python tokenizer whose sample is 2 KB keeps its working set in the caches through the
switches; a 500x400 JPEG's does not. The rest (1 worker on one core -12% too) is the benchmark's 2-core recordings
running slower than its 1-core runs (271-364 samples/s against 347-384 for 2 and 3 workers on one core), which by hand
did not show. Not changed: bytes per sample would tell these two pipelines apart, but a real BPE tokenizer's working set
is its merges table, which a sample's bytes do not show.

Measured 2026-12-04 (session 27), down only, starved and the 2-thread compute (the rows that failed it before).
At 2363721, ``--rounds 1 --out /tmp/s27/tr``: starved +2/+9/+10% (1/2/3 workers on one core), the 2-thread compute
+18/+33/+37%: the plan kept the script's 2 intra-op threads on one core beside the workers (``split_threads`` compared
the threads it would keep with the compute's occupancy on the target, already clamped to its one core, so it never
cut them). The same configurations run by hand on one core, 2 threads against 1 in two rounds: the training process
1.8-2.4 ms of CPU per sample with 2, 1.4-1.9 with 1; the workers' CPU per sample 2.9-4.8 ms for the same 2.8 ms of
recorded work in either (one round's rates 142-220 samples/s for the same configuration: this VM's lone vCPU drifts).
At e92f2ce (threads cut where they outnumber the target's cores), ``--rounds 2 --out /tmp/s27/tr2``: starved +9/+16/+9%,
the 2-thread compute (now run with 1 thread, as planned) +10/+25/+10%: **down median 10%, worst 25%, not met**. Every
down row is over-predicted: one core does less per CPU second than the recording's two (starved's 0-worker recordings
cost more per sample on one core, session 25) and nothing in the model prices it; the baseline again moved -16..+5%.

Measured 2026-12-03 (session 25, at d9b5b07: a worker's CPU second dearer while the training computes on another core
beside it, ``COMPUTE_NEIGHBOUR_COST``), ``--rounds 2 --out /tmp/s25/tr``: **1 -> 2 cores median 7%, worst 18%, all
18 within 20%: met**; 2 -> 1 cores median 6%, worst 30%: the 2-thread compute's 3 workers on one core 0.62x planned,
0.42x and 0.53x measured (+30%), starved's 1 and 2 workers on one core +25% and +20% (0.73x and 0.69x planned, 0.58x
each; +18% and +8% in session 24's second run). Not met down. Probe 1.48 to 2.18 (median 1.90); the baseline run again
moved by a median of 6% (-15% to +39%). Rescored offline (``--rescore``) with this model, session 24's runs: up 5%/23%
and 3%/18% (from 8%/27% and 6%/13%), down unchanged (7%/26%, 7%/22%). Tried offline and not kept: a CPU second on a
lone CPU 10-15% dearer (starved's 0-worker recordings cost 18% more per sample on one core than on two, but slow
storage's 0.98x and large JPEGs' 1.07x): down's worst fell to 19% in this run and rose to 28-31% in session 24's, up's
worst rose to 29-41%.

Measured 2026-12-03 (session 24, the model unchanged since 04ec143), two runs of ``--rounds 2``. The first (``--out
/tmp/s24/tr``, 8fad570): 1 -> 2 cores median 8%, worst 27% (tokenize 2 workers: 1.88x planned, rounds 1.33x and 1.61x;
its 1-core baselines measured 391, 353 and, after the planned runs, 242 samples/s); 2 -> 1 cores median 7%, worst 26%
(the 2-thread compute's 1 worker on one core, 0.66x planned, 0.49x and 0.57x; tokenize -14..-21%: its 1 worker ran
faster on one core, 330-363 samples/s, than on two, 273-326). Not met. The second (``--out /tmp/s24/tr2``, 6cb3f69,
with the probe below): **1 -> 2 cores median 6%, worst 13%, all 18 within 20%: met**; 2 -> 1 cores median 7%, worst
22% (the heavy model, which no worker count changes, 1.00x planned and 1.29x measured with 2 workers on one core,
1.09-1.30x in every down row; the 2-thread compute's 3 workers +20%). Not met down. The probe: 2 cores busy together
did 1.62 to 2.34 times the work of one alone (median 1.92), and the baseline run again moved by a median of 7%
(-20% to +21%). Between these runs a fixed Python loop took 0.69 to 1.14 CPU seconds a minute apart, and two busy
vCPUs once got 1.1-1.4 CPU seconds a wall second between them (the guest counts no steal): a 2-core plan is a plan for
cores the host does not always give.

Measured 2026-12-03 (session 23, 04ec143: a new worker's warm-up priced at epoch starts, which these 40-step runs
of one epoch do not reach, so the plans are session 22's), ``--rounds 2 --out /tmp/s23/tr``, on a drifting machine (the
baseline run again moved by a median of 10%, from -26% to +33%): 1 -> 2 cores median 9%, worst 24% (tokenize 1 worker:
planned 1.07x, rounds 0.71x and 1.01x; 2-thread compute with 1 worker: 1.22x planned, rounds 1.11x and 0.87x, where
session 22 measured 1.24x and 1.17x for the same plan); 2 -> 1 core median 5%, worst 12%. Up not met, down met.

Measured 2026-12-03 (session 22, b23123c: the load costs read from the runs' own CPU per sample, a worker's CPU second
+4% with every core busy and +8% time-shared, the training step's +10% time-shared, and a 0-worker run's batches from
workers read 4 times over by a CPU training step), nothing else running but **a drifting machine**: the baseline run
again moved by a median of 10% and up to +51% (session 20: 1%), and the heavy model, which no worker count changes,
measured 0.86x to 1.14x. ``--rounds 2 --out /tmp/s22/tr``, 22 min: 1 -> 2 cores median 6%, worst 20% (tokenize 3
workers: 1.83x planned, 1.52x measured in both rounds, against 1-core baselines of 300, 249 and 282 samples/s); 2 -> 1
cores median 4%, worst 21% (tokenize 2 workers: 0.86x planned, rounds 1.22x and 0.97x). The same recordings planned
with session 20's constants: up 5%/17%, down 6%/24%. Session 20's quiet run (``/tmp/s20/tr2``) re-planned with this
model: up 2%/9%, down 2%/8% (with session 20's constants 2%/15% and 3%/11%); the eight saved runs of sessions 17-20
(189 planned configurations) median 3.5%, mean 4.9%, four over 20% (session 20's constants: 4.3%, 6.1%, five).

Measured 2026-12-03 (session 20: the training process's own work pays 40% for sharing its core, and a 0-worker
run's intra-op threads spinning while it loads are not a load on the cores, cad1d67), nothing else running, a quiet
machine (the baseline run again moved by median 1%), ``--rounds 2 --out /tmp/s20/tr2``, 18 min: 1 -> 2 cores median
absolute error 2%, worst 15% (tokenize 3 workers: 1.66x planned, 1.92x and 1.99x measured); 2 -> 1 cores median 3%,
worst 11% (tokenize 2 workers); **all 36 within 20%, both directions met**. The 2-thread compute on one core +9%, -1%,
+6% (session 19: +15%, +25%, +16%), starved +9%, +4%, +3%. The run before it this session (``/tmp/s20/tr``, 0315765,
with the compute's time-sharing cost only) had down worst 23%: the 2-thread compute's 1 worker on one core, 0.76x
planned against 0.62x measured in both rounds. Its 2-core recording counted its second thread spinning while the
first loaded batches as a busy core, so every CPU second it measured was priced 12% dear against a target's; counting
the compute's work only re-planned that session's row at +13% and the run after it measured +9%. Re-planned with
this model (``--rescore``): session 19's run up 7%/16%, down 6%/40% (its tokenize rows, which that day's 1-core runs
measured 1.3-1.4x faster than its 2-core recordings, see below); session 18's up 3%/18%, down 5%/16%.

Measured 2026-12-02 (session 19, the model unchanged since session 18), nothing else running, ``--rounds 2 --out
/tmp/s19/tr``, 30 min: 1 -> 2 cores median absolute error 7%, worst 16% (tokenize 2 workers), **all 18 within 20%**;
2 -> 1 cores median 9%, worst 39%, three outside: tokenize 1 and 2 workers (-28%, -39%: its 1-core runs measured
217-241 samples/s against 152-178 for its 2-core recordings, while the up direction's 1-core recordings measured
159-193: the machine moved this scenario by up to 30% between runs) and the 2-thread compute's 2 workers (+25%).
Starved down +3%, +14%, +3%. Tried offline on these sessions (``--rescore``) and not kept: a time-sharing cost that
grows with each runnable thread per CPU beyond one (to 2 or 3, instead of stopping at one), from the starved workers'
CPU per sample on one core (+12%, +20%, +31% with 1, 2, 3 workers over its in-process loading on two): starved 2
workers +14% -> +6% and the 2-thread rows +25/+16% -> +19/+2%, but starved 3 workers +3% -> -13%, large JPEGs 3
workers -4% -> -17% and tokenize 3 workers -14% -> -23%; down median 8-10%, worst unchanged. Large 2000x1500 JPEGs
(whose decode outgrows the caches anyway) do not pay it, 500x400 ones do: the cost depends on a working set no run
records.

Measured 2026-12-02 (session 18, with workers that wait on storage queueing for a core, cda3938), nothing else running,
``--rounds 3 --out /tmp/transfer18``, 49 min: 1 -> 2 cores median absolute error 2%, worst 17% (tokenize, 3 workers:
1.68x planned, rounds 2.02x 1.68x 2.18x), **every one of the 18 within 20%**; 2 -> 1 cores median 8%, worst 23%, two
outside: starved 1 worker +21% and 3 workers +23%. Slow storage's 3 workers on 1 core +8% (was +21% in every run
before the term: 2.64x planned, 2.45x measured), 2 workers +7%; the 2-thread compute +14..+19%; large JPEGs, tokenize
and the heavy model within 14%. What the starved rows miss, measured beside this run with plain torch (no stallscope):
the training step's CPU per sample rises from 2.0-2.15 ms alone to 2.64-2.93 ms with one worker decoding on the other
core and 2.75-2.79 ms with two (+30-40%), and on one core beside workers the 0-worker recording's 1.9 ms becomes
2.9-3.4 ms; the workers' decode and resize rise by 10-26%. The model prices both at 12% (``ALL_CORES_BUSY_COST``,
``TIME_SHARING_COST``): a compute suffers a neighbour more than a decode does, on this VM by about three times.

Measured 2026-12-02 (session 17, later: a compute's threads cut in the rows whose workers would take their cores,
303db5a), ``--only 2-thread``, defaults, about 4.5 min each. Quiet (``/tmp/transfer17c``): up (1 -> 2 cores, 1 compute
thread) 1 worker +5%, 2 workers -4%, 3 workers -2%; down (2 -> 1 core) +12%, +21%, +33%. The run before it
(``/tmp/transfer17b``) had a test suite of mine running beside its up rows: up -3%, +6%, +46% (3 workers measured
1.13x and 0.90x, against 1.43x and 1.57x quiet), down +17%, +16%, +42%. Down again with 1 thread on the 1 core
(``/tmp/transfer17d``, code not kept: no change measured): +29%, +13%, +28%. So the up direction holds once the
threads are cut, and the down direction over-predicts the 1-core rate by 12-42% in every run of this session (the
earlier run's down rows, re-planned by this model, +8..+17%). With transfer17's other five scenarios (unchanged by
these terms: 1 compute thread), up is median 5%, worst 17% (tokenize), and down median 7%, worst 33% or more:
not met.

Measured 2026-12-02 (session 17, the first run with rounds, the model of session 16), nothing else running, defaults
(--rounds 2), about 40 min, ``--out /tmp/transfer17``: 1 -> 2 cores median absolute error 7%, worst 63%; 2 -> 1 cores median
8%, worst 31%; the baselines moved by median 8% (-31% to +60%). Within 20% both ways: large JPEGs (-9..+4%), heavy model
(-7..+4%); slow storage but 3 workers on 1 core (2.93x planned, 2.43x measured in both rounds: +21%); starved up
(+2..+9%) but down +15..+21%; tokenize but 2 workers on 1 core (-29%: rounds 1.01x and 1.40x). Outside in both
directions, and in every round: the 2-thread compute, up +33..+63% (one worker beside it on 2 cores measured 0.91x of
its 1-core rate without workers, planned 1.20x: a 1-core recording cannot show the second thread's spinning, which
takes the worker's core on 2), down -22..-31% (its 2-core recording counts the second thread's spinning during the
in-process loading as the training process's CPU, which on 1 core mostly yields).

Measured 2026-12-02 (session 15: each CPU second priced at the load of the configuration, 6b025d9), nothing else
running, defaults, 14 min, ``--out /tmp/transfer15``: 1 -> 2 cores median absolute error 12%, worst 56%; 2 -> 1 cores
median 13%, worst 52%; the repeated baseline moved by median 4% (-5% to +13%). The same runs re-planned by the
session-14 model (``--rescore``): 19%/62% and 13%/70%. The load terms were fitted to earlier runs' saved sessions
(this session's constants), so these runs are the first they had not seen. Within 20% both ways: slow storage
(-2..+17%), large JPEGs (-19..+13%), heavy model (-2..+6%). Outside: starved +14..+52% (its 1- and 2-worker runs on
2 cores measured 0.83x and 1.17x, against 1.19x and 2.11x in session 14's runs of the same configurations), tokenize
-37..+44%, 2-thread compute up to +56%.

Measured 2026-12-02 (session 14: stops of restarted workers priced, the steady steps after the workers' first
round), nothing else running, defaults, 15 min: 1 -> 2 cores median absolute error 10%, worst 63%; 2 -> 1 cores
median 16%, worst 47%; the repeated baseline moved by median 9% (-36% to +41%). Within 20% both ways: slow storage
(-2..+13%), heavy model (-16..+12%); starved up (-8..+12%) but down +14..+47%; large JPEGs up +5..+22%, down
-5..+42%; tokenize up +43..+55% (two Python-heavy workers beside the training process measured 1.29x against 2.00x
planned), down +8..+19%; 2-thread compute up +20..+63%, down -28..-21%.

Measured 2026-12-01 (session 11, after the SMT term, which does not act on this machine), nothing else running,
defaults with the baseline run again, 13 min: 1 -> 2 cores median absolute error 13%, worst 73%; 2 -> 1 cores median
9%, worst 28%; the repeated baseline moved by median 5% (up to +68%). The same code with a single baseline an hour
earlier: 17%/88% and 15%/43%. Within 20% in both directions: slow storage, large JPEGs, starved down. The heavy model
ran 1.15-1.18x faster on one core than on two for the same work: a process beside a busy second vCPU runs slower on
this VM than taking turns on one.

Measured 2026-12-01 (later, after the receive, shared-memory and other-CPU terms were reworked), nothing else
running, defaults, 11 min 16 s: 1 -> 2 cores median absolute error 13%, worst 61%; 2 -> 1 cores median 10%, worst
30%. Within 20% everywhere: slow storage (-3..+10%), large JPEGs (-20..+8%). Tokenize up -12/-14% (was +28..+89%),
down -30..+22%; heavy model up +11..+27% (measured 0.79-0.90x for one core more: a core runs slower while the
other is busy on this VM), down -4..+3%; starved up +17..+34%, down +10..+21%; 2-thread compute up +27..+61% (a
compute recorded on one core shows one busy core, whatever its thread count), down -13..-5%.

Measured 2026-12-01 on the 2-core machine, nothing else running, defaults (6 scenarios x workers 1, 2, 3): 1 -> 2
cores median absolute error 10%, worst 89%; 2 -> 1 cores median 14%, worst 66%. Within 20% everywhere: slow storage
(-3..+17%), large JPEGs (-9..+13%), heavy model (-8..+12%). Outside: tokenize (up +28..+89%: two Python-heavy workers
beside the training process on 2 cores measured 1.25x against 1.99x), 2-thread compute (up +27..+39%, down -31..-42%:
a compute recorded on one core cannot show how its threads scale), starved down (+19..+66%: workers squeezed onto
the training process's one core cost more than their share).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_sweep import scenarios as sweep_scenarios

from stallscope.analysis import analyze
from stallscope.analysis.plan import plan_run
from stallscope.cli.args import at_least
from stallscope.health.cpu_probe import effective_cpus
from stallscope.session import Session

#: The issue's scenarios: starved, large JPEGs, Python tokenizing, slow storage, heavy model, 2-thread compute.
DEFAULT_SCENARIOS = ("starved", "large JPEGs", "tokenize (1", "slow storage", "heavy model", "2-thread compute")
GPU_SCENARIO = "GPU images (1 worker)"
GPU_FILES = 600  # a smaller demo dataset: generated in seconds on the GPU machine



def scenario_pool(wanted: tuple[str, ...] | list[str]) -> dict[str, list[str]]:
    """The scenarios the names in ``wanted`` may pick from; the CPU ones (whose datasets need the sample photos)
    only where one of them is wanted."""
    pool: dict[str, list[str]] = {}
    if any(GPU_SCENARIO.startswith(w) for w in wanted):
        from stallscope.demo.dataset import DatasetSpec, demo_dataset
        from stallscope.demo.reference_train import __file__ as reference_script

        pool[GPU_SCENARIO] = [sys.executable, reference_script, "--device", "auto", "--data",
                              str(demo_dataset(DatasetSpec(n_files=GPU_FILES))), "--repeat-dataset", "8", "--workers", "1",
                              "--persistent-workers", "--pin-memory", "--batch-size", "32", "--threads", "1",
                              "--epochs", "1000"]
    if any(not GPU_SCENARIO.startswith(w) for w in wanted):
        pool.update(sweep_scenarios())
    return pool


def record(store: Path, command: list[str], steps: int, workers: int | None, cpus: list[int], out: Path,
           threads: int | None = None) -> dict:
    args = [sys.executable, "-m", "stallscope", "run", "--quiet", "--store", str(store), "--json", str(out),
            "--steps", str(steps)]
    if workers is not None:
        args += ["--set", f"num_workers={workers}"]
    if threads is not None:
        args += ["--set", f"torch_threads={threads}"]
    done = subprocess.run([*args, "--", *command], capture_output=True, text=True, check=False,
                          preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    summary = json.loads(out.read_text())
    return {"session": summary["session"], "samples_per_s": summary["throughput"]["samples_per_s"],
            "cores": len(cpus), "workers": workers, "threads": threads}


def planned_threads(recorded: dict, cores: int, workers: int) -> int | None:
    """The compute threads the plan gives ``workers`` on ``cores`` (None: as the script sets them): the planned
    configuration is run as planned."""
    row = plan_run(Session.load(recorded["session"]), cores=cores, workers=workers).row(workers)
    return row.compute_threads if row else None


def measure(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mine = sorted(os.sched_getaffinity(0))
    small, large = mine[:args.record_cores], mine[:args.plan_cores]
    if len(large) < args.plan_cores:
        raise SystemExit(f"needs {args.plan_cores} CPUs in this process's affinity, has {len(mine)}")
    wanted = args.only or DEFAULT_SCENARIOS
    results: dict = {}
    for name, command in scenario_pool(wanted).items():
        if not any(name.startswith(o) for o in wanted):
            continue
        for direction, source, target in (("up", small, large), ("down", large, small)):
            if direction not in args.directions:
                continue
            rounds = []
            delivered = [effective_cpus(large)]
            for r in range(args.rounds):
                # each round records its own baseline and runs the planned configurations after it, in the
                # other order every second round, so that the machine's drift does not favour one worker count
                recorded = record(out / "store", command, args.steps, None, source, out / "s.json")
                measured = {}
                for w in (args.workers if r % 2 == 0 else list(reversed(args.workers))):
                    measured[str(w)] = record(out / "store", command, args.steps, w, target, out / "s.json",
                                              planned_threads(recorded, len(target), w))
                rounds.append({"recorded": recorded, "measured": measured})
            entry: dict = {"rounds": rounds}
            if args.again:  # the baseline once more, after: the machine's drift over the scenario shows, and halves
                entry["recorded_again"] = record(out / "store", command, args.steps, None, source, out / "s.json")
            delivered.append(effective_cpus(large))
            entry["effective_cores"] = {"cores": len(large), "before": round(delivered[0], 3),
                                       "after": round(delivered[1], 3)}
            results[f"{name} [{direction}: {len(source)}->{len(target)} cores]"] = entry
            (out / "results.json").write_text(json.dumps(results, indent=1))
            print(f"measured {name} ({direction})", flush=True)
    return results


def _rounds(entry: dict) -> list[dict]:
    """An entry's rounds, each with the baseline after it (the next round's, or the one run again at the end):
    results saved before ``--rounds`` hold one round at the top level."""
    rounds = entry.get("rounds") or [{"recorded": entry["recorded"], "measured": entry["measured"]}]
    afters = [r["recorded"] for r in rounds[1:]] + [entry.get("recorded_again")]
    return [{**r, "after": after} for r, after in zip(rounds, afters)]


def rescore(results: dict) -> int:
    """Plan each round's recording for each measured configuration and compare. With several rounds, the
    prediction is the median of the rounds' predictions and the measured speedup the median of theirs: one
    40-step run on a shared VM can be 15-40% off the next of the same configuration."""
    errors: dict[str, list[float]] = {"up": [], "down": []}
    drifts: list[float] = []
    print("| scenario | recorded | planned | predicted | measured | error | rounds measured | planned samples/s "
          "| measured samples/s |")
    print("|---|---|---|--:|--:|--:|---|--:|--:|")
    for name, entry in results.items():
        direction = "up" if "[up" in name else "down"
        predicted: dict[str, list[float]] = {}
        measured: dict[str, list[float]] = {}
        planned_rates: dict[str, list[float]] = {}
        measured_rates: dict[str, list[float]] = {}
        described = ""
        mismatched: set[str] = set()
        for one in _rounds(entry):
            rec = one["recorded"]
            session = Session.load(rec["session"])
            analysis = analyze(session)
            model = analysis.capacity.model if analysis.capacity else None
            if model is None or not analysis.steps.samples:
                continue
            described = f"{model.workers} w, {rec['cores']} cores"
            baseline = rec["samples_per_s"]
            if one["after"]:  # the geometric mean of the baseline before and after the planned runs
                drifts.append(one["after"]["samples_per_s"] / baseline - 1)
                baseline = (baseline * one["after"]["samples_per_s"]) ** 0.5
            for w, run in one["measured"].items():
                plan = plan_run(session, cores=run["cores"], workers=int(w), analysis=analysis)
                if plan.row(int(w)).compute_threads != run.get("threads"):
                    mismatched.add(w)  # planned with other compute threads than it was run with
                planned = plan.row(int(w)).samples_per_s
                predicted.setdefault(w, []).append(planned / model.rate())
                measured.setdefault(w, []).append(run["samples_per_s"] / baseline)
                planned_rates.setdefault(w, []).append(planned)
                measured_rates.setdefault(w, []).append(run["samples_per_s"])
        if not predicted:
            print(f"| {name} | (no model) | | | | | | | |")
            continue
        for w in sorted(predicted, key=int):
            cores = entry.get("rounds", [entry])[0]["measured"][w]["cores"]
            p, m = statistics.median(predicted[w]), statistics.median(measured[w])
            error = p / m - 1
            threads = entry.get("rounds", [entry])[0]["measured"][w].get("threads")
            planned_as = f"{w} w{f' {threads} t' if threads else ''}, {cores} cores"
            if w in mismatched:  # not the configuration the plan now gives: shown, not scored
                print(f"| {name.split(' [')[0]} | {described} | {planned_as} (the plan now cuts the threads "
                      f"otherwise) | {p:.2f}x | {m:.2f}x | (not scored) | | | |")
                continue
            errors[direction].append(abs(error))
            print(f"| {name.split(' [')[0]} | {described} | {planned_as} | {p:.2f}x | {m:.2f}x "
                  f"| {100 * error:+.0f}% | {' '.join(f'{x:.2f}x' for x in measured[w])} "
                  f"| {statistics.median(planned_rates[w]):.1f} | {statistics.median(measured_rates[w]):.1f} |")
    for direction, values in errors.items():
        if values:
            print(f"\n{direction}: median absolute error {100 * statistics.median(values):.0f}%, worst "
                  f"{100 * max(values):.0f}%, {len(values)} planned configurations")
    probes = [(e["effective_cores"]["cores"], e["effective_cores"][when]) for e in results.values()
              if "effective_cores" in e for when in ("before", "after")]
    if probes:
        figures = [cores for _, cores in probes]
        print(f"\n{probes[0][0]} cores busy together did {min(figures):.2f} to {max(figures):.2f} times the work of "
              f"one alone (median {statistics.median(figures):.2f}), probed before and after each scenario: the plans "
              f"assume {probes[0][0]}")
    if drifts:
        print(f"\nthe baseline run again after the planned runs: {', '.join(f'{100 * d:+.0f}%' for d in drifts)} "
              f"(median absolute {100 * statistics.median(abs(d) for d in drifts):.0f}%): the machine's own drift, "
              "in the measured speedups as noise")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder for the sessions and results.json")
    p.add_argument("--rescore", metavar="OUT", help="re-plan from a finished --out folder; runs nothing")
    p.add_argument("--record-cores", type=int, default=1)
    p.add_argument("--plan-cores", type=int, default=2)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=at_least(1), default=2,
                   help="record the baseline and run the planned configurations this many times, alternately; "
                        "the medians are compared (default 2)")
    p.add_argument("--only", nargs="*", help=f"scenario names (prefixes) to run; '{GPU_SCENARIO}' only when named")
    p.add_argument("--directions", nargs="+", choices=["up", "down"], default=["up", "down"],
                   help="up: record on --record-cores, plan and measure on --plan-cores; down: the reverse")
    p.add_argument("--no-again", dest="again", action="store_false",
                   help="do not run each baseline a second time after its planned runs (by default the measured "
                        "speedups are over the geometric mean of the two)")
    args = p.parse_args()
    if args.rescore:
        return rescore(json.loads((Path(args.rescore) / "results.json").read_text()))
    if not args.out:
        p.error("give --out DIR (or --rescore DIR)")
    return rescore(measure(args))


if __name__ == "__main__":
    sys.exit(main())
