"""stallscope's start-up hook, put on PYTHONPATH by ``stallscope run`` for the target job only.

It installs the recorder when the launcher's environment says so, then runs whatever
``sitecustomize`` would have run without us, so the user's environment is unchanged.

Every Python the job starts reads this file, including interpreters stallscope does not support
(another version, another virtual environment, Python 2). So it is written to parse on any of them,
takes its own folder back out of ``sys.path``, and acts only in a Python that can import stallscope
on its own, or whose version is the launcher's (then it may borrow the launcher's packages). Elsewhere
it is silent and only chains to the interpreter's own ``sitecustomize``.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _stallscope_supported():
    # The names are stallscope.settings' (ENV_RUN_DIR, ENV_DISABLE, ENV_PKG_PARENT, ENV_PYTHON_VERSION),
    # written out: this runs before stallscope can be imported (a test checks they agree).
    if not os.environ.get("STALLSCOPE_RUN_DIR") or os.environ.get("STALLSCOPE_DISABLE"):
        return False
    if sys.version_info < (3, 10):
        return False
    try:
        import stallscope  # noqa: F401
        return True
    except ImportError:
        pass
    version = "%d.%d" % sys.version_info[:2]
    fallback = os.environ.get("STALLSCOPE_PKG_PARENT")
    if not fallback or os.environ.get("STALLSCOPE_PYTHON_VERSION") != version:
        return False  # another Python: the launcher's packages are not built for it
    if fallback not in sys.path:
        sys.path.append(fallback)
    return True


def _stallscope_start():
    try:
        from stallscope.recorder import bootstrap

        bootstrap.install()
    except Exception as exc:  # never stop the user's job because the recorder failed
        sys.stderr.write("stallscope: recorder not installed: %r\n" % (exc,))


def _chain_next_sitecustomize():
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    if sys.version_info < (3, 4):  # Python 2: the older finder, same effect
        import imp
        try:
            found = imp.find_module("sitecustomize", others)
        except ImportError:
            return
        sys.modules.pop("sitecustomize", None)
        imp.load_module("sitecustomize", *found)
        return
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# Our folder leaves sys.path (the child processes still find it through PYTHONPATH).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _stallscope_supported():
    _stallscope_start()
_chain_next_sitecustomize()
