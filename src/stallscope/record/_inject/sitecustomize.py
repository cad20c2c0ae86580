"""stallscope's start-up hook, put on PYTHONPATH by ``stallscope run`` for the target job only.

It installs the recorder when the launcher's environment says so, then runs whatever
``sitecustomize`` would have run without us, so the user's environment is unchanged.
"""

import os
import sys


def _stallscope_start() -> None:
    # The names are stallscope.settings' (ENV_RUN_DIR, ENV_DISABLE, ENV_PKG_PARENT), written out: this runs in
    # every Python process of the job, before stallscope can be imported (a test checks they agree).
    if not os.environ.get("STALLSCOPE_RUN_DIR") or os.environ.get("STALLSCOPE_DISABLE"):
        return
    try:
        import stallscope  # noqa: F401
    except ImportError:
        fallback = os.environ.get("STALLSCOPE_PKG_PARENT")
        if fallback and fallback not in sys.path:
            sys.path.append(fallback)
    try:
        from stallscope.record import bootstrap

        bootstrap.install()
    except Exception as exc:  # never stop the user's job because the recorder failed
        print(f"stallscope: recorder not installed: {exc!r}", file=sys.stderr)


def _chain_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_stallscope_start()
_chain_next_sitecustomize()
