"""What a user or the launcher sets from outside the script: the ``--set`` vocabulary and every
``STALLSCOPE_*`` environment variable.

One owner for both, imported by the CLI, the launcher, the tuner and the recorder alike. It is a leaf
module (standard library only) because the recorder imports it inside every process of the job.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# --- environment variables --------------------------------------------------------------------------------
#: The run directory the recorder writes its event files into; its presence turns the recorder on.
ENV_RUN_DIR = "STALLSCOPE_RUN_DIR"
#: The ``--set`` overrides, JSON-encoded (see :func:`encode_overrides`).
ENV_OVERRIDES = "STALLSCOPE_OVERRIDES"
#: ``--steps N``: the job stops cleanly after N training steps.
ENV_MAX_STEPS = "STALLSCOPE_MAX_STEPS"
#: The store directory when ``--store`` is not given.
ENV_HOME = "STALLSCOPE_HOME"
#: Set to anything to keep the recorder out of a job that inherited the launcher's environment.
ENV_DISABLE = "STALLSCOPE_DISABLE"
#: Set to anything to see stallscope's own traceback on an internal error (by default it goes to a file).
ENV_DEBUG = "STALLSCOPE_DEBUG"
#: The launcher's pid: the process whose parent it is, is the script's main process.
ENV_LAUNCHER_PID = "STALLSCOPE_LAUNCHER_PID"
#: Where the ``stallscope`` package lives, for a job whose Python cannot import it otherwise.
ENV_PKG_PARENT = "STALLSCOPE_PKG_PARENT"
#: The launcher's Python version ("3.11"): only an interpreter of that version may borrow its packages.
ENV_PYTHON_VERSION = "STALLSCOPE_PYTHON_VERSION"
#: The rank process a DataLoader worker works for (set by each rank for the workers it starts).
ENV_RANK_PID = "STALLSCOPE_RANK_PID"
#: ``stallscope bench``: the bench-mode configuration (JSON) for the job's main process.
ENV_BENCH = "STALLSCOPE_BENCH"
#: ``stallscope tune``: where a trial's ``stallscope run`` writes the figures the tuner measures, from the
#: trial's own Analysis (read by the launcher only; the script never sees it).
ENV_TRIAL_FIGURES = "STALLSCOPE_TRIAL_FIGURES"
#: Stack samples per second inside batch fetches (``recorder/stacks.py``); 0 turns the sampler off.
ENV_STACK_SAMPLE_HZ = "STALLSCOPE_STACK_SAMPLE_HZ"
#: "0": no profiler window in the run (recorder/op_window.py).
ENV_OP_WINDOW = "STALLSCOPE_OP_WINDOW"
#: Bytes of one raw event file before the process starts the next (``recorder/events.py``); the folder folds the
#: finished ones as the run goes (``folding.py``). Tests set it small to fold within seconds.
ENV_SEGMENT_BYTES = "STALLSCOPE_SEGMENT_BYTES"
#: Tests only: the folding's sizes, "window_ms=500,lead=2000,trail=2000,anomaly=1000,period_ms=200,lag_ms=300"
#: (``folding.Limits``), so that a run of seconds folds as one of days would.
ENV_FOLDING = "STALLSCOPE_FOLDING"
#: Tests only: seconds ``pack`` sleeps per record, so a test can kill it mid-way.
ENV_PACK_THROTTLE = "STALLSCOPE_PACK_THROTTLE_S"

# --- the --set vocabulary -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessSetting:
    """A ``--set`` name that is no DataLoader argument but a setting of the training process (or of the dataset a
    DataLoader is built with), which the recorder applies itself when the script makes its first DataLoader."""
    kind: str  #: the value's type, as ``SETTABLE`` spells it
    call: str  #: the torch call that makes the setting in the user's code, ``{}`` standing for the value
    help: str  #: what it is, for ``--set``'s help
    #: an environment variable the launcher puts in the job's environment (torch reads it before any code of the
    #: script runs), not a call the recorder makes
    env: bool = False


#: The training process's settings one may override: the ONE list (the recorder applies them in
#: ``recorder/loader.py``; the CLI help, the advice's words and the tuner read them from here).
PROCESS_SETTINGS: dict[str, ProcessSetting] = {
    "sharing_strategy": ProcessSetting("str", "torch.multiprocessing.set_sharing_strategy({!r})",
                                       "how workers pass tensors"),
    "torch_threads": ProcessSetting("int", "torch.set_num_threads({})",
                                    "the training process's intra-op threads, torch.set_num_threads"),
    "matmul_precision": ProcessSetting("str", "torch.set_float32_matmul_precision({!r})",
                                       "float32 matmul precision: highest, high (TF32 on GPUs that have it) or "
                                       "medium; it changes what is computed"),
    "cudnn_benchmark": ProcessSetting("bool", "torch.backends.cudnn.benchmark = {}",
                                      "cuDNN's timed choice of convolution algorithms, for inputs of fixed size"),
    "channels_last": ProcessSetting("bool", "model = model.to(memory_format=torch.channels_last), and each batch's "
                                            "images .to(memory_format=torch.channels_last)",
                                    "the model's 4-D weights and its 4-D inputs in channels_last memory format "
                                    "(what Tensor Core convolutions work in)"),
    "autocast": ProcessSetting("str", "with torch.autocast(device_type, dtype=torch.{}): around the model's forward "
                                      "and the loss",
                               "mixed precision: bfloat16 runs the model's forward under torch.autocast, its "
                               "floating outputs cast back to float32 for the loss; it changes what is computed"),
    "streaming_cache_limit": ProcessSetting(
        "str", "StreamingDataset(..., cache_limit={!r})",
        "MosaicML Streaming's local cache limit in bytes or with a unit (e.g. 20gb), set on the StreamingDataset a "
        "DataLoader is built with"),
    "streaming_predownload": ProcessSetting(
        "int", "StreamingDataset(..., predownload={})",
        "the samples MosaicML Streaming downloads ahead of each worker, set on the StreamingDataset a DataLoader is "
        "built with"),
    "PYTORCH_CUDA_ALLOC_CONF": ProcessSetting(
        "str", "export PYTORCH_CUDA_ALLOC_CONF={} in the job's environment before the script starts, since torch "
               "reads it when CUDA starts",
        "the CUDA caching allocator's options, an environment variable, e.g. expandable_segments:True", env=True),
}

#: Arguments one may override, with the type of their value. Object-valued ones (dataset, sampler,
#: collate_fn...) are not values one can type on a command line, so they are refused with a clear message.
SETTABLE: dict[str, str] = {
    "num_workers": "int",
    "batch_size": "int",
    "pin_memory": "bool",
    "prefetch_factor": "int",
    "persistent_workers": "bool",
    "drop_last": "bool",
    "timeout": "float",
    "in_order": "bool",
    "multiprocessing_context": "str",
    "shuffle": "bool",
    "pin_memory_device": "str",
    **{name: setting.kind for name, setting in PROCESS_SETTINGS.items()},
}


def set_help() -> str:
    """``--set``'s help, naming the process settings from their one list."""
    process = " and ".join(f"{name} ({setting.help})" for name, setting in PROCESS_SETTINGS.items())
    return f"override a DataLoader argument at construction, e.g. --set num_workers=4 (repeatable); also {process}"


#: DataLoader arguments as the Hugging Face Trainer's TrainingArguments spell them.
TRAINER_ARGUMENTS = {"num_workers": "dataloader_num_workers", "persistent_workers": "dataloader_persistent_workers",
                     "prefetch_factor": "dataloader_prefetch_factor", "pin_memory": "dataloader_pin_memory"}


def in_code(values: Mapping[str, Any], where: Mapping[str, Any] | None) -> str:
    """A change of settings as the user writes it in their framework, and where: ``TrainingArguments(...)``
    for the Hugging Face Trainer, the ``DataLoader(...)`` of the ``train_dataloader`` hook for Lightning,
    the ``DataLoader(...)`` call otherwise; process settings as their torch calls."""
    process = "".join(PROCESS_SETTINGS[k].call.format(v) + ("" if PROCESS_SETTINGS[k].env else
                                                            " at the start of training") + ", and "
                      for k, v in values.items() if k in PROCESS_SETTINGS)
    values = {k: v for k, v in values.items() if k not in PROCESS_SETTINGS}
    if not values:
        return process.removesuffix(", and ")
    where = where or {}
    site, function = where.get("site"), where.get("function")
    if where.get("framework") == "transformers" and all(k in TRAINER_ARGUMENTS for k in values):
        args = ", ".join(f"{TRAINER_ARGUMENTS[k]}={v!r}" for k, v in values.items())
        return process + f"TrainingArguments(..., {args})" + (f" at {site}" if site else "")
    text = process + f"DataLoader(..., {', '.join(f'{k}={v!r}' for k, v in values.items())})"
    if site and function and function != "<module>":
        return f"{text} in {function}() at {site}"
    return f"{text} at {site}" if site else text


#: More worker processes (DataLoader workers, pack's readers) or intra-op threads than any machine runs. A bigger
#: number is a typo: ``--set num_workers=100000`` forked about 850 workers and 11 GB before it was killed.
MAX_WORKERS = 1024
MAX_THREADS = 1024


class OverrideError(ValueError):
    """A ``--set`` item that cannot be applied; the message says why and what would be accepted."""


def _parse_value(name: str, kind: str, text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("none", "null"):
        return None
    if kind == "bool":
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise OverrideError(f"--set {name}={text}: expected true or false")
    if kind == "int":
        try:
            value = int(text)
        except ValueError:
            raise OverrideError(f"--set {name}={text}: expected an integer") from None
        if value < 0:
            raise OverrideError(f"--set {name}={text}: must not be negative")
        return value
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise OverrideError(f"--set {name}={text}: expected a number") from None
    return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Parse ``["num_workers=4", "pin_memory=true"]``; raise OverrideError with a helpful message."""
    parsed: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise OverrideError(f"--set {item!r}: expected name=value, for example --set num_workers=4")
        name, text = item.split("=", 1)
        name = name.strip()
        if name not in SETTABLE:
            known = ", ".join(sorted(SETTABLE))
            raise OverrideError(f"--set {name}: not one of the settings --set can change; choose from {known}")
        parsed[name] = _parse_value(name, SETTABLE[name], text)
    if parsed.get("matmul_precision") not in (None, "highest", "high", "medium"):
        raise OverrideError("--set matmul_precision: choose highest, high or medium")
    if parsed.get("autocast") not in (None, "bfloat16"):
        raise OverrideError("--set autocast: bfloat16 (float16 also needs a GradScaler in the script, which --set "
                            "cannot add)")
    if parsed.get("sharing_strategy") not in (None, "file_system", "file_descriptor"):
        raise OverrideError("--set sharing_strategy: choose file_system or file_descriptor")
    if parsed.get("prefetch_factor") == 0:
        raise OverrideError("--set prefetch_factor=0: must be at least 1")
    for name, setting in PROCESS_SETTINGS.items():
        if setting.env and name in parsed and (parsed[name] is None or not str(parsed[name]).strip()):
            raise OverrideError(f"--set {name}=: give the variable a value (to run without it, unset it in your "
                                "shell)")
    if "torch_threads" in parsed and not parsed["torch_threads"]:
        raise OverrideError(f"--set torch_threads={parsed['torch_threads']}: a number of threads, at least 1")
    if (parsed.get("num_workers") or 0) > MAX_WORKERS:
        raise OverrideError(f"--set num_workers={parsed['num_workers']}: at most {MAX_WORKERS} worker processes "
                            f"(a few per CPU core is already plenty)")
    if (parsed.get("torch_threads") or 0) > MAX_THREADS:
        raise OverrideError(f"--set torch_threads={parsed['torch_threads']}: at most {MAX_THREADS} threads "
                            f"(one per CPU core is the most that helps)")
    if parsed.get("batch_size") == 0:
        raise OverrideError("--set batch_size=0: must be at least 1 (or none: no batching)")
    timeout = parsed.get("timeout")
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise OverrideError(f"--set timeout={timeout}: seconds, 0 (wait forever) or more")
    context = parsed.get("multiprocessing_context")
    if context is not None:
        import multiprocessing  # here, not at the top: the recorder imports this module in every process

        methods = multiprocessing.get_all_start_methods()
    if context is not None and context not in methods:
        raise OverrideError(f"--set multiprocessing_context={context}: choose one of {', '.join(methods)}")
    return parsed


def format_value(value: Any) -> str:
    """A value as ``--set`` reads it back: ``true``/``false``, ``none``, numbers and text as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def overrides_text(overrides: Mapping[str, Any]) -> str:
    """``num_workers=2 persistent_workers=true``: settings as ``--set`` reads them, for tables and notes."""
    return " ".join(f"{k}={format_value(v)}" for k, v in overrides.items())


def set_arguments(overrides: Mapping[str, Any], order: tuple[str, ...] = tuple(SETTABLE)) -> list[str]:
    """``["--set", "num_workers=2", ...]``, in ``order`` (names outside it last)."""
    args: list[str] = []
    for name in sorted(overrides, key=lambda n: order.index(n) if n in order else len(order)):
        args += ["--set", f"{name}={format_value(overrides[name])}"]
    return args


def encode_overrides(overrides: Mapping[str, Any]) -> str:
    return json.dumps(dict(overrides))


def decode_overrides(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}
