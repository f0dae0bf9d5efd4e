"""Models: sequence -> K interests. Importing this package registers every built-in model."""

from recsys.models.base import InterestModel, build_model, model_names, register
from recsys.models import comirec_dr, comirec_sa, gru4rec, mind, popular, sasrec, youtube_dnn  # noqa: F401  (register)

__all__ = ["InterestModel", "build_model", "model_names", "register"]
