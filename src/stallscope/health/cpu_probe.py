"""Do this machine's cores do a core's work each when all are busy? A short busy-loop probe, for ``doctor``.

Every prediction stallscope makes scales whole cores: 2 workers on 2 usable cores get two cores' work done (a
core's further hardware threads are priced apart, ``SMT_YIELD``). A virtual machine whose host lends its vCPUs'
cores to other guests, or cores held to a lower clock when all of them run, do less, and nothing the job measures
of itself shows it: the guest's CPU clocks do not count the time the host took. So the probe runs a busy Python loop
on one core alone, then on every usable core at once (one hardware thread each, as many as the CPU quota allows), each
pinned to its CPU and started together, alternately for a few rounds (one round's figure moves by a tenth or more on
such a machine; calibration: doctor-cpu-probe-rounds), and compares the work done.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable

from stallscope.health import cgroup
from stallscope.health.checks import PASS, WARN, Check, not_applicable, unknown
from stallscope.health.host import Host
from stallscope.health.system import allowed_cpus, core_groups, usable_cpu_count

#: Seconds of each busy loop, and rounds of one-alone then all-together (alternated, so a drift of the host
#: between the two does not read as one of them; calibration: doctor-cpu-probe-rounds).
PROBE_S = 0.5
PROBE_ROUNDS = 3
#: At most this many cores are probed at once (a probe of a 192-core host forks no more than this).
MAX_PROBED_CPUS = 64
#: Below this share of the probed cores' count the check warns: all busy, they did less than this of the work of
#: as many cores of their own.
MIN_SHARE = 0.85

Rates = Callable[[list[int], float], list[float]]


def loop_rates(cpus: list[int], seconds: float = PROBE_S) -> list[float]:
    """Iterations per wall second of a busy Python loop pinned to each of ``cpus``, all of them at once (a forked
    child each, threads would share one interpreter lock; each starts when all are forked). Raises ``OSError``
    where a child could not be forked, pinned or heard from: no figure is better than a wrong one."""
    go_read, go_write = os.pipe()
    running: dict[int, int] = {}  # child pid -> the read end of its pipe, until it is reaped
    try:
        for cpu in cpus:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: pinned, it waits for the start, spins for ``seconds`` and says how far it got
                code = 1
                try:
                    os.close(read)
                    os.close(go_write)
                    os.sched_setaffinity(0, [cpu])
                    os.read(go_read, 1)  # end of file once the parent closes its end: every child starts at once
                    start, count = time.perf_counter(), 0
                    while time.perf_counter() - start < seconds:
                        count += 1
                    os.write(write, repr(count / seconds).encode())
                    code = 0
                finally:
                    os._exit(code)
            os.close(write)
            running[pid] = read
        os.close(go_write)
        go_write = -1
        rates = []
        for pid in list(running):
            with os.fdopen(running[pid]) as reply:
                running[pid] = -1  # closed as the block ends
                text = reply.read()
            _, status = os.waitpid(pid, 0)
            del running[pid]
            if status != 0 or not text:
                raise OSError(f"the busy loop pinned to a CPU of {cpus} failed (status {status})")
            rates.append(float(text))
        return rates
    finally:  # an interrupted or failed probe leaves no child spinning and no descriptor open
        for fd in (go_read, go_write):
            if fd >= 0:
                os.close(fd)
        for pid, read in running.items():
            if read >= 0:
                os.close(read)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def effective_cpus(cpus: list[int], seconds: float = PROBE_S, rounds: int = PROBE_ROUNDS,
                   rates: Rates = loop_rates) -> float:
    """The work ``cpus`` do together, all busy, in units of one of them busy alone just before: ``len(cpus)``
    where each is a core of its own and nothing else takes it. ``rates``: :func:`loop_rates`, or a stand-in."""
    alone = together = 0.0
    for _ in range(max(1, rounds)):
        alone += rates(cpus[:1], seconds)[0]
        together += sum(rates(cpus, seconds))
    return together / alone if alone > 0 else 0.0


def cpus_to_probe(host: Host) -> tuple[list[int], str]:
    """The CPUs to pin the loops to: one hardware thread of each core the affinity spans (every CPU where the
    topology is not visible), no more than the CPU quota's whole CPUs nor ``MAX_PROBED_CPUS``; and what limited
    them, for the check's value (empty where nothing did). An empty list where the affinity cannot be read."""
    allowed, _ = allowed_cpus(host)
    if not allowed:
        return [], ""
    groups = core_groups(host, allowed)
    cpus = sorted(min(group & allowed) for group in groups) if groups else sorted(allowed)
    why = f"one hardware thread of each of {len(cpus)} cores" if len(cpus) < len(allowed) else ""
    quota = cgroup.cpu_quota(host).value  # CPUs' worth of time per period, fractional
    if quota is not None and quota < len(cpus):  # more loops than the quota would be throttled, not measured
        cpus = cpus[:max(1, math.floor(quota))]
        why = f"the cgroup quota's {quota:g} CPUs"
    if len(cpus) > MAX_PROBED_CPUS:
        cpus = cpus[:MAX_PROBED_CPUS]
        why = f"the first {MAX_PROBED_CPUS}"
    return cpus, why


def check_cpu_capacity(host: Host, seconds: float = PROBE_S, rounds: int = PROBE_ROUNDS,
                       rates: Rates = loop_rates) -> Check:
    """``cpu.capacity``: the probe's figure against the probed cores' count. Only on the live machine (the probe
    runs there) with CPU affinity to pin to; ``seconds <= 0`` skips it (``doctor --no-bench``)."""
    title = "CPU capacity when all are busy"
    why = ("stallscope's predictions and plans count each usable core as a core's work. A host that lends the "
           "vCPUs' cores to other guests, or a lower all-core clock, give less, which no cost the job measures of "
           "itself shows (the guest does not count the time the host took): worker counts then gain less than "
           "predicted, by the share missing here.")
    if seconds <= 0:
        return not_applicable("cpu.capacity", title, "micro-benchmarks skipped (--no-bench)")
    if not host.live or not hasattr(os, "sched_setaffinity") or not hasattr(os, "fork"):
        return not_applicable("cpu.capacity", title, "probed only on the machine stallscope runs on, with CPU "
                              "affinity (Linux)")
    cpus, limited = cpus_to_probe(host)
    if not cpus:
        return unknown("cpu.capacity", title, "the CPU affinity could not be read", why=why)
    if len(cpus) < 2:
        return not_applicable("cpu.capacity", title, "1 usable core: nothing to compare it with")
    try:
        factor = effective_cpus(cpus, seconds, rounds, rates)
    except OSError as exc:
        return unknown("cpu.capacity", title, f"the probe could not run: {exc.strerror or exc}", why=why)
    n = len(cpus)
    share = factor / n
    value = (f"{n} cores busy together did {factor:.2f} times the work of one alone ({100 * share:.0f}% of {n}; "
             f"{rounds} rounds of {seconds:g} s" + (f"; {limited}" if limited else "") + ")")
    data = {"probed_cpus": n, "effective_cpus": round(factor, 3), "share": round(share, 3),
            "seconds": seconds, "rounds": rounds}
    threshold = f">= {100 * MIN_SHARE:.0f}% of {n}"
    if share >= MIN_SHARE:
        return Check("cpu.capacity", title, PASS, value, threshold, why, "", data)
    usable = usable_cpu_count(host) or len(cpus)  # the one rule for usable CPUs: affinity, then the quota
    fix = (f"Count {100 * share:.0f}% of the CPUs in a plan (stallscope plan RUN --cores {usable * share:.1f} "
           f"rather than {usable}), run doctor again later (a shared host's figure moves with its other guests), or "
           "use a machine with dedicated cores.")
    return Check("cpu.capacity", title, WARN, value, threshold, why, fix, data)
