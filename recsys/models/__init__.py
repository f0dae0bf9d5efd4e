"""Models: sequence -> K interests. Importing this package registers every built-in model."""

from recsys.models.base import InterestModel, build_model, model_names, register

__all__ = ["InterestModel", "build_model", "model_names", "register"]
