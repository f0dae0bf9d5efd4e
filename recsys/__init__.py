"""recsys: multi-interest sequential retrieval (ComiRec-SA and baselines) with Triton kernels.

The Python API (see docs/python-api.md)::

    import recsys
    run = recsys.fit(clicks_df, overrides={"model.name": "comirec_sa"})
    run.evaluate(); run.recommend(users=["17"], n=10); run.export("out/", format="onnx")
    run = recsys.Run.load("runs/<name>")

``fit``, ``Run`` and ``load_config`` are imported on first use, so ``import recsys`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {"fit": "recsys.api", "Run": "recsys.api", "load_config": "recsys.config", "Config": "recsys.config"}
__all__ = ["Config", "Run", "fit", "load_config"]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'recsys' has no attribute {name!r}")
    return getattr(importlib.import_module(_API[name]), name)
