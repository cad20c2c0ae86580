"""Do this machine's CPUs do a CPU's work each when all are busy? A short busy-loop probe, for ``doctor``.

Every prediction stallscope makes scales whole CPUs: 2 workers on 2 usable CPUs get two CPUs' work done. A
virtual machine whose host lends its vCPUs' cores to other guests, hardware threads of one core counted as CPUs,
or a CPU held to a lower clock when all its cores run, do less, and nothing the job measures of itself shows it:
the guest's CPU clocks do not count the time the host took (the same fixed loop took 0.69 to 1.14 CPU seconds a
minute apart on the 2-core development VM, where 2 busy vCPUs did 1.48 to 2.34 times the work of one alone). So
the probe runs a busy Python loop on one CPU alone, then on every usable CPU at once, each pinned to its CPU,
alternately for a few rounds (one round's figure moves by 10-20% there), and compares the work done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from stallscope.health.checks import NA, PASS, WARN, Check, not_applicable, unknown
from stallscope.health.host import Host
from stallscope.health.system import allowed_cpus

#: Seconds of each busy loop, and rounds of one-alone then all-together (alternated, so a drift of the host
#: between the two does not read as one of them).
PROBE_S = 0.5
PROBE_ROUNDS = 3
#: At most this many CPUs are probed at once (a probe of a 192-CPU host forks no more than this).
MAX_PROBED_CPUS = 64
#: Below this share of the probed CPUs' count the check warns: all busy, they did less than this of the work of as
#: many CPUs of their own.
MIN_SHARE = 0.85

Rates = Callable[[list[int], float], list[float]]


def loop_rates(cpus: list[int], seconds: float = PROBE_S) -> list[float]:
    """Iterations per wall second of a busy Python loop pinned to each of ``cpus``, all of them at once (a forked
    child each: threads would share one interpreter lock)."""
    children = []
    for cpu in cpus:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child spins on its CPU for ``seconds`` of wall time and reports how far it got
            try:
                os.close(read)
                os.sched_setaffinity(0, [cpu])
                start, count = time.perf_counter(), 0
                while time.perf_counter() - start < seconds:
                    count += 1
                os.write(write, repr(count / seconds).encode())
            finally:
                os._exit(0)
        os.close(write)
        children.append((pid, read))
    rates = []
    for pid, read in children:
        with os.fdopen(read) as reply:
            text = reply.read()
        os.waitpid(pid, 0)
        rates.append(float(text) if text else 0.0)
    return rates


def effective_cpus(cpus: list[int], seconds: float = PROBE_S, rounds: int = PROBE_ROUNDS,
                   rates: Rates = loop_rates) -> float:
    """The work ``cpus`` do together, all busy, in units of one of them busy alone just before: ``len(cpus)``
    where each is a CPU of its own and nothing else takes it. ``rates``: :func:`loop_rates`, or a stand-in."""
    alone = together = 0.0
    for _ in range(max(1, rounds)):
        alone += rates(cpus[:1], seconds)[0]
        together += sum(rates(cpus, seconds))
    return together / alone if alone > 0 else 0.0


def check_cpu_capacity(host: Host, seconds: float = PROBE_S, rounds: int = PROBE_ROUNDS,
                       rates: Rates = loop_rates) -> Check:
    """``cpu.capacity``: the probe's figure against the usable CPUs' count. Only on the live machine (the probe
    runs there) with CPU affinity to pin to; ``seconds <= 0`` skips it (``doctor --no-bench``)."""
    title = "CPU capacity when all are busy"
    why = ("stallscope's predictions and plans count each usable CPU as a CPU's work. A host that lends the vCPUs' "
           "cores to other guests, hardware threads counted as CPUs, or a lower all-core clock give less, which "
           "no cost the job measures of itself shows (the guest does not count the time the host took): worker "
           "counts then gain less than predicted, by the share missing here.")
    if seconds <= 0:
        return not_applicable("cpu.capacity", title, "micro-benchmarks skipped (--no-bench)")
    if not host.live or not hasattr(os, "sched_setaffinity") or not hasattr(os, "fork"):
        return not_applicable("cpu.capacity", title, "probed only on the machine stallscope runs on, with CPU "
                              "affinity (Linux)")
    allowed, source = allowed_cpus(host)
    if not allowed:
        return unknown("cpu.capacity", title, source, why=why)
    cpus = sorted(allowed)[:MAX_PROBED_CPUS]
    try:
        factor = effective_cpus(cpus, seconds, rounds, rates)
    except OSError as exc:
        return unknown("cpu.capacity", title, f"the probe could not run: {exc.strerror or exc}", why=why)
    n = len(cpus)
    share = factor / n if n else 0.0
    value = (f"{n} CPUs busy together did {factor:.2f} times the work of one alone ({100 * share:.0f}% of {n}; "
             f"{rounds} rounds of {seconds:g} s)")
    data = {"probed_cpus": n, "effective_cpus": round(factor, 3), "share": round(share, 3),
            "seconds": seconds, "rounds": rounds}
    if n < 2:
        return Check("cpu.capacity", title, NA, f"1 usable CPU: nothing to compare it with ({value})", "", why, "",
                     data)
    if share >= MIN_SHARE:
        return Check("cpu.capacity", title, PASS, value, f">= {100 * MIN_SHARE:.0f}% of {n}", why, "", data)
    fix = (f"Plan with --cores {factor:.1f} (stallscope plan RUN --cores ...) rather than {n}, run doctor again "
           "later (a shared host's figure moves with its other guests), or use a machine with dedicated cores.")
    return Check("cpu.capacity", title, WARN, value, f">= {100 * MIN_SHARE:.0f}% of {n}", why, fix, data)
