"""Run a function right after a module is imported, without importing it ourselves.

The bootstrap must stay cheap in every Python process started with our environment (pip,
compile workers, the user's own subprocesses), so nothing is imported eagerly: a finder on
``sys.meta_path`` wraps the loader of the few modules we patch and calls the patch once the
module body has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import time
import types
from collections.abc import Callable, Sequence

PostImportHook = Callable[[types.ModuleType], None]

#: How long each hooked module's first import took in this process, its own imports included: ``torch``'s is
#: what a spawned DataLoader worker pays again before it loads anything.
import_seconds: dict[str, float] = {}


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, hooks: list[PostImportHook]) -> None:
        self._loader = loader
        self._hooks = hooks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        started = time.perf_counter()
        self._loader.exec_module(module)
        import_seconds.setdefault(module.__name__, time.perf_counter() - started)
        # Put the real loader back so importlib.resources and friends see what they expect.
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        for hook in self._hooks:
            _run_hook(hook, module)


def _run_hook(hook: PostImportHook, module: types.ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # a failed patch must never break the user's import
        print(f"stallscope: could not instrument {module.__name__}: {exc!r}", file=sys.stderr)


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.hooks: dict[str, list[PostImportHook]] = {}
        self._in_progress: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        hooks = self.hooks.get(fullname)
        if not hooks or fullname in self._in_progress:
            return None
        self._in_progress.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._in_progress.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, hooks)
        return spec


_finder: PostImportFinder | None = None


def when_imported(module_name: str, hook: PostImportHook) -> None:
    """Call ``hook(module)`` after ``module_name`` is imported (now, if it already is)."""
    global _finder
    if _finder is None:
        _finder = PostImportFinder()
        sys.meta_path.insert(0, _finder)
    _finder.hooks.setdefault(module_name, []).append(hook)
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        _run_hook(hook, module)
