"""``stallscope pack SRC OUT --format lmdb|wds`` and ``stallscope pack --verify OUT``.

A thin wrapper over :func:`stallscope.data.pack` and :func:`stallscope.data.verify`: exit 0
on success, 1 when bad files stopped a ``--strict`` pack, verification found damage or the pack
was made but its ``--report`` file could not be written, 2 for bad arguments (missing source,
empty folder, unknown format, conflicting output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stallscope.render.safe_text import printable


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pack",
        help="pack an image folder or file list into LMDB or WebDataset shards",
        description="Pack an ImageFolder tree (root/<class>/<image>) or a 'path,label' file list into one LMDB "
        "database or WebDataset tar shards, checking every image. Rerun the same command after a crash to resume.",
        epilog="Read it back with stallscope.data.PackedImageDataset(OUT). Check it with: stallscope pack --verify OUT",
    )
    parser.add_argument("src", nargs="?", metavar="SRC", help="ImageFolder root or a CSV file list (path,label)")
    parser.add_argument("out", nargs="?", metavar="OUT", help="output directory (created when the pack is complete)")
    parser.add_argument("--format", choices=("lmdb", "wds"), default="lmdb", help="lmdb (default) or wds tar shards")
    parser.add_argument("--max-side", type=_max_side, default=0, metavar="N|auto",
                        help="re-encode images whose longer side exceeds N pixels (0: keep every image's size); auto: "
                             "each image at the smallest size at which every crop of the training's transform "
                             "(--crop...) still holds its output's pixels, so the crops the model sees stay the same")
    parser.add_argument("--crop", type=int, default=224, metavar="SIZE",
                        help="with --max-side auto: RandomResizedCrop's output size (default 224)")
    parser.add_argument("--crop-scale", type=float, default=0.08, metavar="MIN",
                        help="with --max-side auto: RandomResizedCrop's smallest scale (default 0.08)")
    parser.add_argument("--crop-ratio", type=float, nargs=2, default=(3 / 4, 4 / 3), metavar=("LOW", "HIGH"),
                        help="with --max-side auto: RandomResizedCrop's aspect ratios (default 0.75 1.333)")
    parser.add_argument("--resize-shorter", type=int, metavar="S",
                        help="with --max-side auto: size for an evaluation transform Resize(S) + CenterCrop instead "
                             "(the shorter side kept at S or more)")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality when re-encoding (default 90)")
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                        help="processes that read and check images (default: CPU count, at most 8)")
    parser.add_argument("--shard-size", type=int, default=1000, metavar="N", help="records per tar shard (wds)")
    parser.add_argument("--commit-every", type=int, default=512, metavar="N",
                        help="records per LMDB transaction, i.e. how much a crash can lose (lmdb)")
    parser.add_argument("--strict", action="store_true", help="stop at the first bad file instead of skipping it")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT or a different unfinished pack")
    parser.add_argument("--report", metavar="PATH", help="write the result (records, skipped files) as JSON")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verify", metavar="PACK", help="check every record of PACK against its index and exit")
    parser.set_defaults(handler=run)


def _max_side(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of pixels, or auto") from None


def _crop_fit(args: argparse.Namespace) -> Any:
    """The CropFit ``--max-side auto`` sizes images for; raises ValueError with the reason for bad --crop values."""
    from stallscope.data.crop_fit import CropFit

    return CropFit((args.crop, args.crop), args.crop_scale, tuple(args.crop_ratio), args.resize_shorter)


def _say_estimate(src: str, fit: Any, quality: int) -> None:
    """Before packing: the auto size's rule and what it is predicted to store."""
    from stallscope.data.packing.estimate import estimate
    from stallscope.data.sources import open_source

    sources = open_source(src)
    found = estimate([str(p) for p, _ in sources.samples], fit, len(sources), quality)
    square, four_three = fit.longer_side(10_000, 10_000), fit.longer_side(10_000, 7_500)
    decode = ""
    if found.decode_ms is not None:
        before, after = found.decode_ms
        decode = (f"; a full decode of the images it shrinks {before:.1f} -> {after:.1f} ms each on this machine "
                  f"({1e3 / before:,.0f} -> {1e3 / after:,.0f} images/s a core, Pillow)")
    print(printable(f"--max-side auto for {fit.describe()}: each image's longer side at least {square:,} px "
                    f"(square), {four_three:,} px (4:3); of {found.sampled} sampled images {found.shrunk} are stored "
                    f"smaller, the sample keeping {found.pixels_kept:.0%} of its pixels: predicted pack about "
                    f"{found.packed_bytes / 1e6:,.1f} MB of images (the originals {found.original_bytes / 1e6:,.1f} "
                    f"MB){decode}"), file=sys.stderr)


def _err(message: str) -> int:
    print(printable(f"stallscope pack: {message}"), file=sys.stderr)
    return 2


def _run_verify(path: str) -> int:
    from stallscope.data.index import PackFormatError
    from stallscope.data.packing import verify

    try:
        result = verify(path)
    except PackFormatError as exc:
        return _err(str(exc))
    except ImportError as exc:
        return _err(f"{exc} (pip install 'stallscope[data]')")
    except OSError as exc:
        return _err(f"cannot read {exc.filename or path}: {exc.strerror or exc}")
    if result.ok:
        print(f"ok: {result.checked} records in {path} ({result.format}) match their checksums and labels")
        return 0
    if len(result.errors) == 1:
        print(f"FAILED: {path} ({result.format}, {result.checked} records checked): {result.errors[0]}")
        return 1
    print(f"FAILED: {len(result.errors)} problem(s) in {path} ({result.checked} records checked)")
    for line in result.errors[:50]:
        print(f"  {line}")
    if len(result.errors) > 50:
        print(f"  ... and {len(result.errors) - 50} more")
    return 1


def _progress_bar(enabled: bool) -> tuple[Any, Callable[[int, int, int], None] | None]:
    """A rich progress bar showing images/s and MB/s, or a no-op."""
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("packing"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), transient=False,
    )
    task = progress.add_task("pack", total=None, rate="")
    state: dict[str, Any] = {"first": None, "t0": 0.0}

    def update(done: int, total: int, nbytes: int) -> None:
        import time

        now = time.perf_counter()
        if state["first"] is None:
            state["first"], state["t0"] = done - 1, now
        elapsed = max(now - state["t0"], 1e-6)
        n = done - state["first"]
        progress.update(task, completed=done, total=total,
                        rate=f"{n / elapsed:,.0f} img/s  {nbytes / elapsed / 1e6:,.1f} MB/s")

    return progress, update


def run(args: argparse.Namespace) -> int:
    if args.verify:
        if args.src or args.out:
            return _err("--verify takes only the pack to check: stallscope pack --verify OUT")
        if args.report:
            return _err("--report describes a pack being made; --verify prints its result (and sets the exit code)")
        return _run_verify(args.verify)
    if not args.src or not args.out:
        return _err("give SRC and OUT: stallscope pack SRC OUT --format lmdb|wds (or --verify OUT)")
    from stallscope.cli.args import output_error

    if args.report and (report_error := output_error([args.report], None)):
        return _err(report_error)  # said before packing, not after minutes of it
    from stallscope.data.packing import PackError, PackOptions, PackWriteError, pack
    from stallscope.data.sources import SourceError

    fit = None
    if args.max_side == "auto":
        try:
            fit = _crop_fit(args)
        except ValueError as exc:
            return _err(str(exc))
    options = PackOptions(format=args.format, max_side=0 if fit is not None else args.max_side, crop_fit=fit,
                          quality=args.quality, workers=args.workers, strict=args.strict, shard_size=args.shard_size,
                          commit_every=args.commit_every)
    if not Path(args.src).exists():
        return _err(f"{args.src}: no such folder or file list")
    if fit is not None:
        try:
            _say_estimate(args.src, fit, args.quality)
        except SourceError as exc:
            return _err(str(exc))
    bar, update = _progress_bar(not args.no_progress and sys.stderr.isatty())
    try:
        if bar is not None:
            with bar:
                result = pack(args.src, args.out, options, progress=update, force=args.force)
        else:
            result = pack(args.src, args.out, options, force=args.force)
    except KeyboardInterrupt:
        print(printable(f"stallscope pack: interrupted; run the same command again to go on from where it stopped "
                        f"(what is packed so far is kept in {args.out}.partial)"), file=sys.stderr)
        return 130
    except SourceError as exc:
        return _err(str(exc))
    except PackWriteError as exc:
        print(printable(f"stallscope pack: {exc}"), file=sys.stderr)
        if exc.work.exists():
            print(printable(f"stallscope pack: what was packed so far is kept in {exc.work}: make room (or mend the "
                            "folder) and run the same command again to go on from it"), file=sys.stderr)
        else:
            print("stallscope pack: nothing was written; choose an OUT where you can write, or make room",
                  file=sys.stderr)
        return 1
    except PackError as exc:
        print(printable(f"stallscope pack: {exc}"), file=sys.stderr)
        print(printable(f"stallscope pack: nothing was written to {args.out}"), file=sys.stderr)
        return 1 if args.strict and "--strict" in str(exc) else 2
    except ImportError as exc:
        return _err(f"{exc} (pip install 'stallscope[data]')")

    if result.already_complete:
        print(f"{result.out} is already a complete pack of {args.src} ({result.records} records); nothing to do")
    else:
        rate = (result.records - result.resumed_at) / result.seconds if result.seconds else 0.0
        resumed = f", resumed at source #{result.resumed_at}" if result.resumed_at else ""
        print(f"packed {result.records} images into {result.out} ({result.format}, "
              f"{result.bytes_out / 1e6:,.1f} MB) in {result.seconds:.1f} s, {rate:,.0f} img/s{resumed}")
        if result.baseline:
            print(f"{result.baseline} progressive JPEG(s) stored as sequential ones, losslessly: the same pixels, "
                  "decoded 2-3x as fast")
    for problem in result.skipped + result.warnings:
        print(f"  {problem.line()}")
    if result.skipped:
        print(f"skipped {len(result.skipped)} bad file(s); --strict makes them fatal")
    print(f"check it with: stallscope pack --verify {result.out}")
    if args.report:
        doc = {"out": str(result.out), "format": result.format, "records": result.records,
               "digest": result.digest, "resumed_at": result.resumed_at,
               "skipped": [asdict(p) for p in result.skipped], "warnings": [asdict(p) for p in result.warnings]}
        from stallscope.paths import write_file

        try:
            write_file(args.report, json.dumps(doc, indent=1))
        except OSError as exc:  # the pack itself is done, but what asked for the report will not find it
            print(printable(f"stallscope pack: error: the report was not written to {args.report}: "
                            f"{exc.strerror or exc} (the pack itself is complete in {result.out})"), file=sys.stderr)
            return 1
    return 0
