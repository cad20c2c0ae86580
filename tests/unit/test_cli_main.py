"""The entry point's last line of defence: no traceback reaches the user, whatever goes wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from stallscope.cli import history_cmd, main


def test_an_unexpected_error_is_one_line_and_its_traceback_is_kept(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(main.tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("STALLSCOPE_DEBUG", raising=False)

    def broken(_args):
        raise RuntimeError("planted\nsecond line")

    monkeypatch.setattr(history_cmd, "handle", broken)
    assert main.main(["history", "--store", str(tmp_path / "store")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error: RuntimeError: planted" in err and "second line" not in err
    [kept] = list(tmp_path.glob("stallscope-error-*.txt"))
    assert str(kept) in err
    text = kept.read_text()
    assert "Traceback" in text and "RuntimeError: planted" in text and "broken" in text


def test_debug_shows_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("STALLSCOPE_DEBUG", "1")
    monkeypatch.setattr(history_cmd, "handle", lambda _args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main.main(["history", "--store", str(tmp_path / "store")])


def test_ctrl_c_while_the_verbs_import_is_interrupted_not_a_traceback(monkeypatch, capsys):
    def interrupted(_only=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(main, "build_parser", interrupted)
    assert main.main(["run", "--", "python", "x.py"]) == 130
    assert capsys.readouterr().err.strip() == "stallscope: interrupted"


@pytest.mark.parametrize("columns, kept", [("0", False), ("-3", False), ("abc", False), ("", False), ("100", True)])
def test_a_columns_value_that_is_no_width_is_ignored(monkeypatch, columns, kept):
    monkeypatch.setenv("COLUMNS", columns)
    main._tolerant_output()
    assert (os.environ.get("COLUMNS") == columns) is kept


@pytest.mark.parametrize("text, minimum, kind, ok", [("0", 0, int, True), ("-1", 0, int, False), ("x", 0, int, False),
                                                      ("0", 1, int, False), ("2.5", 0, float, True),
                                                      ("nan", 0, float, False), ("inf", 0, float, False)])
def test_numbers_below_their_minimum_are_usage_errors(text, minimum, kind, ok):
    import argparse

    from stallscope.cli.args import at_least

    if ok:
        assert at_least(minimum, kind)(text) == kind(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError):
            at_least(minimum, kind)(text)


def test_a_number_past_its_bound_is_a_usage_error_naming_the_bound():
    import argparse

    from stallscope.cli.args import at_least

    limit = at_least(0, most=1_000_000_000)
    assert limit("30") == 30
    with pytest.raises(argparse.ArgumentTypeError, match="must be at most 1000000000, not 99999999999999999999"):
        limit("99999999999999999999")
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 0"):
        limit("-1")


def test_an_unknown_option_is_said_by_the_verbs_parser(capsys):
    with pytest.raises(SystemExit) as done:
        main.main(["history", "--nosuch"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "usage: stallscope history" in err and "unrecognized arguments: --nosuch" in err


@pytest.mark.parametrize("verb", ["run", "demo", "report", "history", "compare", "export", "merge", "plan", "tune",
                                  "bench"])
def test_an_empty_store_is_a_usage_error_not_the_default_store(verb, capsys):
    """``--store "$UNSET"`` must not read or write ./.stallscope without a word."""
    with pytest.raises(SystemExit) as done:
        main.main([verb, "--store", " "])
    assert done.value.code == 2 and "--store: needs a folder's name, not an empty one" in capsys.readouterr().err


def test_standard_error_whose_reader_is_gone_takes_writes_without_raising():
    """What stallscope says on standard error into a closed pipe is dropped, so that the verb keeps its own exit
    code; the stream's other attributes are its own."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = open(write_end, "w", buffering=1, closefd=True)  # noqa: SIM115 - closed below
    try:
        wrapped = main._StderrWithoutReader(stream)
        assert wrapped.write("said to nobody\n") == len("said to nobody\n")
        wrapped.flush()
        assert wrapped.write("and again\n") == len("and again\n")  # the descriptor is /dev/null now
        assert wrapped.fileno() == write_end and wrapped.isatty() is False
    finally:
        stream.close()


@pytest.mark.parametrize("verb", ["run", "demo"])
def test_q_is_the_short_form_of_quiet(verb):
    parser = main.build_parser(verb)
    args, unknown = parser.parse_known_args([verb, "-q", "--", "python", "train.py"])
    assert args.quiet and not unknown


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_standard_output_on_a_full_disk_is_one_line_not_a_bug(tmp_path):
    """``stallscope doctor > file`` on a full disk: the medium failed, not stallscope (/dev/full: every write is
    ENOSPC), and Python's own flush at exit must not fail again after the line."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "stallscope", "doctor", "--no-bench"], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("stallscope: cannot write the output (standard output): "
                                                    "No space left on device"), done.stderr
    assert "internal error" not in done.stderr and "Exception ignored" not in done.stderr


def test_tune_and_bench_say_a_trial_that_could_not_start_is_not_the_stores_fault():
    import errno

    from stallscope.cli.common import store_write_error

    assert store_write_error(OSError(errno.EAGAIN, "Resource temporarily unavailable"), "/s") == (
        "could not start a trial: Resource temporarily unavailable")
    assert store_write_error(OSError(errno.ENOSPC, "No space left on device"), "/s") == (
        "cannot write in the store /s: No space left on device; free some space there, or choose another store with "
        "--store DIR")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_an_output_where_nothing_can_be_written_is_refused_before_the_run(tmp_path):
    """/proc takes no new file, whatever access() says to root: refused before a run that can take hours. A
    folder that takes one is left as it was."""
    from stallscope.cli.args import output_error

    problem = output_error(["/proc/summary.json"], str(tmp_path / "store"))
    assert problem is not None and problem.startswith("cannot write /proc/summary.json: nothing can be written in /proc")
    assert output_error([str(tmp_path / "out" / "summary.json")], str(tmp_path / "store")) is None
    assert list(tmp_path.iterdir()) == []  # the check's own file is gone, and nothing was made



def test_a_closed_standard_error_is_not_wrapped(monkeypatch, tmp_path, capsys):
    """``2>&-``: Python starts with sys.stderr None, and print(file=None) writes to standard output instead."""
    monkeypatch.setattr("sys.stderr", None)
    assert main.main(["history", "--store", str(tmp_path / "nothing")]) == 2
    assert "no run history" in capsys.readouterr().out


def test_ctrl_c_while_the_entry_imports_the_cli_is_interrupted_not_a_traceback():
    # a real SIGINT, sent by the interpreter to itself when the console script's entry asks for ``cli.main``:
    # the KeyboardInterrupt comes from inside the import, before ``cli.main`` could catch anything
    planted = textwrap.dedent("""
        import os, signal, sys
        class SendCtrlC:
            def find_spec(self, name, path=None, target=None):
                if name == "stallscope.cli.main":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, SendCtrlC())
        from stallscope.cli.entry import main
        sys.exit(main())
    """)
    done = subprocess.run([sys.executable, "-c", planted, "run", "--", "python", "x.py"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr.strip()) == (130, "stallscope: interrupted")
