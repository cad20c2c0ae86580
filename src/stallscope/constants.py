"""Names shared by every layer: node ids, schema versions, environment variables."""

from __future__ import annotations

#: The seven stages of an input pipeline, in pipeline order. Stable ids used in every output.
NODE_IDS: tuple[str, ...] = ("storage", "decode", "transform", "loader", "transfer", "compute", "sync")

#: Nodes that sit in front of the model: a fix on one of these is an "input-side" fix.
INPUT_NODES: tuple[str, ...] = ("storage", "decode", "transform", "loader", "transfer")

SESSION_SCHEMA = "stallscope.session/1"
SUMMARY_SCHEMA = "stallscope.summary/1"

#: Environment variables through which the launcher talks to the instrumented processes.
ENV_RUN_DIR = "STALLSCOPE_RUN_DIR"
ENV_OVERRIDES = "STALLSCOPE_OVERRIDES"
ENV_MAX_STEPS = "STALLSCOPE_MAX_STEPS"
ENV_HOME = "STALLSCOPE_HOME"
ENV_DISABLE = "STALLSCOPE_DISABLE"

DEFAULT_STORE_DIRNAME = ".stallscope"
