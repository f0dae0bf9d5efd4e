"""Models: sequence -> K interests. Importing this package registers every built-in model's spec."""

from recsys.models import (  # noqa: F401  (register)
    comirec_dr,
    comirec_sa,
    gru4rec,
    lineage,
    mind,
    popular,
    sasrec,
    youtube_dnn,
)
from recsys.models.base import InterestModel, build_model
from recsys.models.spec import Automatic, ModelSpec, model_names, register, spec_for

__all__ = ["Automatic", "InterestModel", "ModelSpec", "build_model", "model_names", "register", "spec_for"]
