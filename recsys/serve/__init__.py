"""Serving candidates from a trained run: batch top-N (``recsys recommend``) and the HTTP
service (``recsys serve``).

The core (:mod:`recsys.serve.recommender`, :mod:`recsys.serve.batch`,
:mod:`recsys.serve.microbatch`) needs no extra; :mod:`recsys.serve.app` needs FastAPI and
uvicorn (``pip install 'multi-interest-recsys[serve]'``) and is imported only when serving.
"""

from recsys.serve.recommender import Recommendations, Recommender

__all__ = ["Recommendations", "Recommender"]
