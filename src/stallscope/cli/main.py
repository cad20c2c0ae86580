"""``stallscope`` entry point: builds the parser from one module per verb and dispatches."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence

from stallscope import __version__
from stallscope.oserrors import deleted_cwd, os_error_words
from stallscope.render.safe_text import printable
from stallscope.settings import ENV_DEBUG

#: verb -> module defining ``add_parser(subparsers)``; each parser sets ``handler(args) -> int``.
VERBS: dict[str, str] = {
    "run": "stallscope.cli.run_cmd",
    "report": "stallscope.cli.report_cmd",
    "demo": "stallscope.cli.demo_cmd",
    "pack": "stallscope.cli.pack_cmd",
    "doctor": "stallscope.cli.doctor_cmd",
    "history": "stallscope.cli.history_cmd",
    "compare": "stallscope.cli.compare_cmd",
    "tune": "stallscope.cli.tune_cmd",
    "bench": "stallscope.cli.bench_cmd",
    "merge": "stallscope.cli.merge_cmd",
    "export": "stallscope.cli.export_cmd",
    "plan": "stallscope.cli.plan_cmd",
}



def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every verb, or with ``only`` one: a verb's module is imported only when needed,
    so ``stallscope run`` starts fast and one broken optional verb cannot break the others."""
    parser = argparse.ArgumentParser(
        prog="stallscope",
        description="Find out which stage of the input pipeline starves a PyTorch training job, and fix it.",
        epilog="Start with: stallscope run -- python train.py ARGS   (or: stallscope demo)",
    )
    parser.add_argument("--version", action="version", version=f"stallscope {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, module_name in VERBS.items():
        if only is not None and verb != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            subparsers.add_parser(verb, help=f"(unavailable: {exc})")
            continue
        module.add_parser(subparsers)
    return parser


def _verb_in(argv: list[str]) -> str | None:
    for token in argv:
        if token.startswith("-"):
            return None  # global options (--help, --version) need the full parser
        return token if token in VERBS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb. Whatever happens, the user sees a line, not a traceback: Ctrl-C (even while the verb's
    modules are still importing) is ``interrupted`` with exit code 130, and an error stallscope did not expect
    is one line naming the file that holds its traceback (``STALLSCOPE_DEBUG=1`` shows it instead)."""
    _tolerant_output()
    real_stderr = sys.stderr
    if real_stderr is not None:  # None where descriptor 2 was closed (2>&-): rich and print fall back on their own
        sys.stderr = _StderrWithoutReader(real_stderr)
    try:
        return _main(argv)
    finally:
        sys.stderr = real_stderr


def _main(argv: Sequence[str] | None) -> int:
    try:
        args_list = _module_arguments_are_the_modules(list(argv) if argv is not None else sys.argv[1:])
        parser = build_parser(_verb_in(args_list))
        args, unknown = parser.parse_known_args(args_list)
        if unknown:  # said by the verb's own parser, with its usage, not the top-level one's
            _verb_parser(parser, getattr(args, "verb", None)).error(f"unrecognized arguments: {' '.join(unknown)}")
        if not getattr(args, "handler", None):
            parser.print_help()
            return 2
        code = int(args.handler(args))
        sys.stdout.flush()  # redirected output is buffered: a full disk shows here, not after the last line
        return code
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except OSError as exc:
        if exc.filename is None and exc.errno == errno.ENOENT and deleted_cwd() is not None:
            # not a bug: the folder stallscope was started in (where ./.stallscope is looked for) went away
            print(printable(f"stallscope: {os_error_words(exc)}: run it from a folder that exists, or name the "
                            "store with --store DIR"), file=sys.stderr)
            return 2
        if exc.errno not in OUTPUT_ERRNOS:
            if os.environ.get(ENV_DEBUG):
                raise
            return _internal_error(exc)
        return _output_failed(exc)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug must not end in a traceback
        if os.environ.get(ENV_DEBUG):
            raise
        return _internal_error(exc)


def _module_arguments_are_the_modules(argv: list[str]) -> list[str]:
    """``stallscope run [options] -m MODULE ARGS``: as with ``python -m``, every argument after the module's name
    is the module's (its ``--epochs 1``, even its ``--steps 5``), never stallscope's: a ``--`` is put after the
    name so that the parser stops there."""
    if not argv or argv[0] != "run":
        return argv
    run = _verb_parser(build_parser("run"), "run")
    options = {option: action.nargs != 0 for action in run._actions for option in action.option_strings}
    at = 1
    while at < len(argv):
        token = argv[at]
        if token == "--" or not token.startswith("-"):
            return argv  # the command begins here: a -m after it is the command's own
        if token.startswith("--"):
            # --store DIR, or an abbreviation argparse would take for it (--sto DIR); --store=DIR is one token
            named = [o for o in options if o == token] or [o for o in options if o.startswith(token)]
            at += 2 if "=" not in token and len(named) == 1 and options[named[0]] else 1
            continue
        for k, letter in enumerate(token[1:], start=1):  # -q, -qm MODULE, -mMODULE, -qmMODULE
            if letter == "m":
                end = at + 1 if k + 1 < len(token) else at + 2  # the module's name in the token, or the next one
                rest = argv[end:]
                return [*argv[:end], *([] if rest[:1] == ["--"] or not rest else ["--"]), *rest]
            if options.get(f"-{letter}"):  # a short option's value is the rest of the token
                break
        at += 1
    return argv


def _verb_parser(parser: argparse.ArgumentParser, verb: str | None) -> argparse.ArgumentParser:
    """The sub-parser of ``verb``, or ``parser`` itself when there is none."""
    for action in parser._actions:  # argparse keeps its sub-parsers in the one _SubParsersAction
        if isinstance(action, argparse._SubParsersAction) and verb in action.choices:
            return action.choices[verb]
    return parser


class _ReaderGone(BrokenPipeError):
    """The reader of the output went away (``stallscope report | head``): what it read was all it wanted. A
    ``BrokenPipeError``, so that what already handles a closed pipe (a run's summary on standard error, which
    must not cost the script's exit code) handles this one too."""


class _StderrWithoutReader:
    """Standard error whose reader may be gone (``2>&1 | head``): what cannot be written there is dropped, so
    that a verb goes on to its own exit code. ``stallscope run -- ./missing 2>&1 | head -0`` ends with 2, the
    code of the command it could not start, not with the 0 of a reader that had what it wanted (which is for
    standard output only). Everything else is the stream's own."""

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)  # type: ignore[attr-defined]
        except BrokenPipeError:
            self._point_at_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()  # type: ignore[attr-defined]
        except BrokenPipeError:
            self._point_at_devnull()

    def _point_at_devnull(self) -> None:
        """Later writes, and what the stream still holds, go to /dev/null (Python's flush at exit too)."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # type: ignore[attr-defined]
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _reader_went_away() -> int:
    """Exit 0 and quietly, as a reader that stops early (``| head``) asked for."""
    _stdout_to_devnull()
    return 0


def _stdout_to_devnull() -> None:
    """Standard output pointed at /dev/null, so that Python's own flush at exit does not fail again on output
    that could not be written (a closed pipe, a full disk)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _stop_rendering(console: object) -> None:
    """rich's answer to a closed pipe is exit code 1 and no word; stallscope's is to stop rendering and exit 0."""
    raise _ReaderGone


def _tolerant_output() -> None:
    """Output that cannot fail on what it prints: on a terminal or pipe whose encoding lacks a character
    (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``) that character is replaced instead of raising mid-report; a
    ``COLUMNS`` that is not a positive width (``COLUMNS=0`` made every table render as nothing) is ignored; and
    a reader that stops early (``| head``) ends a verb's output with exit code 0, whether it was printing plain
    lines or rich's tables."""
    try:
        from rich.console import Console

        Console.on_broken_pipe = _stop_rendering  # type: ignore[method-assign,assignment]  # rich's hook, replaced
    except ImportError:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="replace")  # type: ignore[union-attr]  # TextIO lacks it; AttributeError below
        except (AttributeError, ValueError, OSError):  # replaced by a caller (pytest's capture), or closed
            pass
    columns = os.environ.get("COLUMNS")
    if columns is not None and not (columns.strip().isdigit() and int(columns) > 0):
        del os.environ["COLUMNS"]


#: Failures of the medium, not of stallscope: where one reaches here it was writing its own output (the verbs
#: say so themselves for the files they are given), most often standard output redirected to a full disk.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def _output_failed(exc: OSError) -> int:
    """One line for output that could not be written, and standard output pointed at /dev/null so that Python's
    own flush at exit does not fail the same way again."""
    where = exc.filename or "the output (standard output)"
    _stdout_to_devnull()
    try:
        print(printable(f"stallscope: cannot write {where}: {exc.strerror or exc}"), file=sys.stderr)
    except OSError:
        pass
    return 2


def _internal_error(exc: BaseException) -> int:
    """Say in one line that stallscope failed, and keep the traceback in a file for the bug report."""
    detail = "".join(traceback.format_exception(exc))
    where = None
    try:
        fd, where = tempfile.mkstemp(prefix=f"stallscope-error-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt")
        with os.fdopen(fd, "w") as fh:
            fh.write(f"stallscope {__version__}, python {sys.version.split()[0]}\nargv: {sys.argv}\n\n{detail}")
    except OSError:
        where = None
    first = f"{type(exc).__name__}: {exc}".splitlines()[0][:300] if str(exc) else type(exc).__name__
    kept = f"the traceback is in {where}" if where else f"set {ENV_DEBUG}=1 to see the traceback"
    try:
        print(printable(f"stallscope: internal error: {first}\n  this is a bug in stallscope; {kept} "
                        "(please include it when reporting)"), file=sys.stderr)
    except OSError:
        pass
    return 1
