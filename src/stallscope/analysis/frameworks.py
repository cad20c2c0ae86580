"""Which training framework built a DataLoader, and where in the user's code to make a change.

The recorder keeps the stack at each DataLoader's creation (``LoaderRecord.stack``, innermost first, from the
first frame outside torch) and, for the Hugging Face Trainer, where the script built its ``TrainingArguments``
(``Session.framework_args``). From those: the user's own frame (the innermost outside site-packages and the
standard library), the framework (the Trainer, Lightning, accelerate, or plain PyTorch), and the place a change
goes, in that framework's words (``settings.in_code``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from stallscope.constants import is_user_file as is_user_file  # the one definition, shared by every layer

#: Framework -> the path fragments of its frames that mark a DataLoader it built.
_FRAMEWORKS = (
    ("transformers", (f"transformers{os.sep}trainer",)),
    ("lightning", (f"{os.sep}lightning{os.sep}", f"{os.sep}pytorch_lightning{os.sep}")),
    ("accelerate", (f"{os.sep}accelerate{os.sep}",)),
)


@dataclass(frozen=True)
class CodeSite:
    """Where to change a DataLoader setting in the user's code: ``framework`` ("transformers", "lightning",
    "accelerate", "pytorch"); ``site`` (file:line) and ``function`` of the user's frame, or of the
    ``TrainingArguments(...)`` call for the Trainer; ``library_site``: the frame that built the DataLoader
    when it is a library's."""
    framework: str
    site: str | None
    function: str | None
    library_site: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"framework": self.framework, "site": self.site, "function": self.function,
                "library_site": self.library_site}


def split_frame(frame: str) -> tuple[str, str, str]:
    """``file:line:function`` -> (file, line, function); a bare ``file:line`` has no function."""
    parts = frame.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], parts[1], parts[2]
    path, _, line = frame.rpartition(":")
    return (path, line, "") if line.isdigit() else (frame, "", "")


def user_frame(stack: list[str]) -> tuple[str, str] | None:
    """(file:line, function) of the innermost frame in the user's own code."""
    for frame in stack:
        path, line, function = split_frame(frame)
        if is_user_file(path):
            return f"{path}:{line}", function
    return None


def framework_of(stack: list[str]) -> str:
    for name, marks in _FRAMEWORKS:
        if any(mark in split_frame(frame)[0] for frame in stack for mark in marks):
            return name
    return "pytorch"


def code_site(site: str, stack: list[str], created_ns: int, pid: int,
              framework_args: list[dict[str, Any]]) -> CodeSite:
    """Where the user changes this DataLoader's settings."""
    framework = framework_of(stack)
    found = user_frame(stack)
    library_site = site if site and not is_user_file(split_frame(site)[0]) else None
    if framework == "transformers":
        built = [a for a in framework_args if a.get("framework") == "transformers" and a.get("pid") == pid
                 and a.get("t_ns", 0) <= created_ns]
        if built:
            return CodeSite(framework, built[-1]["site"], "TrainingArguments", library_site)
    if found is None:
        return CodeSite(framework, None, None, library_site)
    return CodeSite(framework, found[0], found[1] or None, library_site)
