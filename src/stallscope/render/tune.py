"""``stallscope tune``'s table of trials and its closing lines (the confirmed speedup, the change to make)."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from stallscope.settings import overrides_text
from stallscope.tuning.trials import TrialResult
from stallscope.tuning.tuning import TuneResult


def config_text(trial: TrialResult) -> str:
    if not trial.overrides:
        return "(original)"
    return overrides_text(trial.overrides)


def rate_text(trial: TrialResult) -> str:
    if not trial.ok or trial.rate is None:
        return "-"
    return f"{trial.rate.value:.1f} ± {trial.rate.se:.1f}"


def render(result: TuneResult, console: Console) -> None:
    table = Table(title=f"stallscope tune: {result.runs} run{'s' if result.runs != 1 else ''}, {result.steps} steps "
                        f"each ({result.stopped_said})")
    for col in ("#", "why", "change (--set)", result.unit, "verdict", "wait", "s", "result"):
        table.add_column(col, justify="right" if col in ("#", result.unit, "wait", "s") else "left")
    # The winner is a trial of the search (for a diagnosis that ran twice, its second run, with both runs' mean): a
    # run's index is unique among the search and the confirmation.
    winner = result.winner.index if result.winner is not None and result.winner_overrides else None
    for trial in [*result.trials, *result.confirmation]:
        best = " [bold green]<- winner[/]" if trial.index == winner else ""
        table.add_row(str(trial.index), trial.label, Text(config_text(trial)), rate_text(trial), trial.verdict or "-",
                      f"{100 * trial.data_wait_fraction:.0f}%" if trial.data_wait_fraction is not None else "-",
                      f"{trial.wall_s:.0f}",
                      ("ok" if trial.ok else f"[red]failed: {escape(str(trial.reason))}[/]") + best)
    console.print(table)
    if result.original is None or not result.original.ok:
        reason = result.original.reason if result.original else "not run"
        console.print(f"[red]The original configuration failed ({escape(str(reason))}); nothing to tune against.[/]")
        if result.original is not None and result.original.trial_dir:
            console.print(f"Its output (stdout.txt, stderr.txt): {result.original.trial_dir}", markup=False)
        return
    for note in result.notes:
        console.print(note, markup=False)
    if not result.winner_overrides:
        return
    o, w = result.original_confirmed, result.winner_confirmed
    if o and w:
        console.print(f"{'Confirmed' if result.confirmed else 'On confirmation'}: original {o.value:.1f} ± {o.se:.1f} "
                      f"{result.unit}, winner {w.value:.1f} ± {w.se:.1f} {result.unit}: [bold]{result.speedup:.2f}x[/]"
                      + ("  (within noise of each other)" if result.confirmed_within_noise else ""))
    if not result.confirmed:
        console.print(unconfirmed(result), markup=False)
        console.print(f"Trial folders: {result.folder}", markup=False)
        return
    console.print(f"The change:  [bold]{escape(result.in_code())}[/]")
    console.print(f"Without editing code:  {shlex.join(result.rerun_command())}", markup=False)
    console.print(f"Trial folders: {result.folder}", markup=False)


def unconfirmed(result: TuneResult) -> str:
    """Why the search's winner is not the change to make: run again beside the original, it tied or lost."""
    tried = overrides_text(result.winner_overrides)
    o, w = result.original_confirmed, result.winner_confirmed
    if o is None or w is None:
        return (f"No setting tried was confirmed better than the original: the winner's ({tried}) confirmation did "
                "not measure.\nKeep the original configuration.")
    if result.confirmed_within_noise:
        how = "measured within the noise of the original"
    else:  # the search's best was a lucky run, or the machine drifted: a change that measured slower is no change
        how = "ran slower than the original: the trials' gain did not hold"
    return (f"No setting tried was confirmed better than the original: run again beside it, the search's winner "
            f"({tried}) {how}.\nKeep the original configuration, or tune again with more --steps (longer runs "
            "average out the machine's noise and drift).")
