"""Re-analyse every saved session under ROOT with the stallscope on sys.path, and write what each gives (the
summary JSON, the plan as recorded and the plan for a 64-core, 8-GPU target) to OUT/<key>.json, keyed by the
session's path: run it with the code before a change and after, and diff the two folders. A refactor that must
not change behaviour changes nothing there (docs/developing.md, "A change that must not change behaviour").

    pytest -m e2e --basetemp=/tmp/e2e                     # sessions to re-analyse: the e2e suite's
    git worktree add /tmp/before <commit>; cp -r /tmp/before/src /tmp/before-src
    PYTHONPATH=/tmp/before-src python tools/reanalyse.py /tmp/e2e /tmp/re-before
    PYTHONPATH=src python tools/reanalyse.py /tmp/e2e /tmp/re-after
    diff -r /tmp/re-before /tmp/re-after && echo identical

Load neither side from the folder the sessions were recorded with: a traceback's frames are told to be
stallscope's own by the path stallscope is loaded from, so that side alone would place failures differently.
"""
import hashlib
import json
import sys
import traceback
from pathlib import Path

import stallscope
from stallscope.analysis import analyze
from stallscope.analysis.plan import PlanError, plan_dict, plan_run
from stallscope.render.summary import summary_dict
from stallscope.session import Session

if len(sys.argv) != 3:
    sys.exit(f"usage: {sys.argv[0]} ROOT OUT   (every session.json under ROOT, re-analysed into OUT)")
root, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
paths = sorted(p for p in root.rglob("session.json") if p.is_file() and not p.is_symlink())
print("stallscope from", stallscope.__file__, "sessions", len(paths), file=sys.stderr)
bad = 0
for p in paths:
    key = hashlib.sha1(str(p).encode()).hexdigest()[:16]
    doc: dict = {"path": str(p)}
    try:
        session = Session.load(p)
        analysis = analyze(session)
        doc["summary"] = summary_dict(session, analysis, p)
        for name, kw in (("plan_here", {}), ("plan_big", {"cores": 64, "gpus": 8, "step_ms": 20.0})):
            try:
                doc[name] = plan_dict(plan_run(session, analysis=analysis, **kw), session.run_id, "stallscope.plan/1")
            except PlanError as exc:
                doc[name] = f"PlanError: {exc}"
    except Exception as exc:  # noqa: BLE001
        bad += 1
        doc["error"] = f"{type(exc).__name__}: {exc}"
        print(p, traceback.format_exc(limit=3), file=sys.stderr)
    (out / f"{key}.json").write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
print("done", len(paths), "errors", bad, file=sys.stderr)
