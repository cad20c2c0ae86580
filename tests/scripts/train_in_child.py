"""A script whose training runs in a process it starts, not in the launched process itself (a launcher script, a
job wrapper, Hydra): ``train_in_child.py HOW [--levels N] [--parent-steps N] -- TINY_TRAIN_ARGS``.

HOW: ``subprocess`` (``subprocess.run([sys.executable, tiny_train.py, ...])``, through ``--levels`` wrappers),
``fork`` (an ``os.fork()`` child trains and leaves through Python's exit), ``fork-os-exit`` (the same child leaves
through ``os._exit``), ``mp-fork`` / ``mp-spawn`` (a ``multiprocessing.Process`` of that start method).
``--parent-steps N``: the launched process trains N steps of its own first (two processes that both train).
Exits with the training child's exit code."""

import argparse
import multiprocessing
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.path.join(HERE, "tiny_train.py")


def train(args):
    """tiny_train's main in this process; its exit code."""
    sys.path.insert(0, HERE)
    import tiny_train

    sys.argv = [TINY, *args]
    try:
        tiny_train.main()
    except SystemExit as done:
        return done.code or 0
    return 0


def main():
    how, rest = sys.argv[1], sys.argv[2:]
    split = rest.index("--") if "--" in rest else len(rest)
    p = argparse.ArgumentParser()
    p.add_argument("--levels", type=int, default=1)
    p.add_argument("--parent-steps", type=int, default=0)
    a = p.parse_args(rest[:split])
    train_args = rest[split + 1:]
    if a.parent_steps:
        train(["--n", str(8 * a.parent_steps), "--batch-size", "8"])
    if how == "subprocess":
        if a.levels > 1:
            command = [sys.executable, __file__, how, "--levels", str(a.levels - 1), "--", *train_args]
        else:
            command = [sys.executable, TINY, *train_args]
        sys.exit(subprocess.run(command, check=False).returncode)
    if how in ("fork", "fork-os-exit"):
        pid = os.fork()
        if pid == 0:
            code = train(train_args)
            if how == "fork-os-exit":
                sys.stdout.flush()
                os._exit(code)
            sys.exit(code)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    if how in ("mp-fork", "mp-spawn"):
        ctx = multiprocessing.get_context(how[3:])
        child = ctx.Process(target=_mp_target, args=(train_args,))
        child.start()
        child.join()
        sys.exit(child.exitcode)
    sys.exit(f"unknown HOW {how!r}")


def _mp_target(train_args):
    code = train(train_args)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
