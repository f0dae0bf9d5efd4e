"""Models: sequence -> K interests. Importing this package registers every built-in model's spec."""

from recsys.models import comirec_dr, comirec_sa, gru4rec, mind, popular, sasrec, youtube_dnn  # noqa: F401  (register)
from recsys.models.base import InterestModel, build_model
from recsys.models.spec import Automatic, ModelSpec, model_names, register, spec_for

__all__ = ["Automatic", "InterestModel", "ModelSpec", "build_model", "model_names", "register", "spec_for"]
