"""stallscope: find out why a PyTorch training job starves its GPU, and prove the fix."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
