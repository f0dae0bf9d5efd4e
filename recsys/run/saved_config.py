"""A saved run's ``config.json`` -> :class:`~recsys.config.Config`, keeping what the run was
trained with where a default has changed since it was saved.

From :data:`~recsys.config.CONFIG_VERSION` 2 the file holds every value the run used (its resolved
config). A file without ``config_version`` (version 1) was written before the resolver wrote every
value down: it may still hold automatic values, which :func:`recsys.run.build_experiment` decides
from the run's saved dataset by the same rules, and is read as version 1 until then. In either, a
key missing from the file dates the run; the values that were in force then fill it:

- no ``model.positions``: positions were numbered from the oldest click (``"absolute"``), for
  the models that read positions;
- no ``model.score_cap``: the self-attentive scores were not capped (0);
- no ``train.soft_readout_steps``: the readout was the argmax from the first step (0);
- no ``train.negative_readout``: the readout's interest scored the negatives (``"readout"``);
- no ``train.batch_size`` or ``train.lr``: 128 samples a step at 1e-3, their defaults before they
  followed the data (a saved config holds both as plain numbers, which load as they are);
- no ``train.predict_at``: one target per sampled history (``"last"``);
- no ``train.windows``: dense training windows ended anywhere in the sequence (``"random"``);
- no ``train.ema_decay``: the last weights were validated and kept (0);
- no ``train.predict_next``: each target predicted its next click only (1);
- no ``train.item_updates``: every step updated the whole item table (``"dense"``);
- no ``train.interest_reg``: no cosine hinge between interests (0; its margin then 0.5);
- no ``eval.valid_users``: validation scored every validation user (0);
- no ``model.cold_rows``: an item without clicks was its features alone (``"zero"``);
- no ``model.cold_scale``: an item without clicks scored as trained (1);
- no ``retrieval.new_item_share``: no places kept for items without clicks (0);
- no ``model.mixer``, ``model.block``, ``model.init``, ``model.num_heads``, ``model.filter_alpha``,
  ``model.attention_dropout``, ``train.min_target`` or ``train.draw``: the values every model had
  before they became the model's own (attention in pre-norm blocks, torch's start, 2 heads, 0.7, 0,
  4 and ComiRec's user-then-target draw);
- and what the model's own spec says (:attr:`recsys.models.spec.ModelSpec.saved_defaults`).
"""

from __future__ import annotations

from typing import Any

from recsys.config import CONFIG_VERSION, Config, ConfigError, ModelConfig, config_from_dict, renamed
from recsys.models.spec import spec_for

_TRAIN_DEFAULTS = {
    "batch_size": 128,
    "lr": 1e-3,
    "soft_readout_steps": 0,
    "negative_readout": "readout",
    "predict_at": "last",
    "windows": "random",
    "ema_decay": 0.0,
    "predict_next": 1,
    "item_updates": "dense",
    "interest_reg": 0.0,
    "interest_margin": 0.5,
    "min_target": 4,
    "draw": "users",
}
# the [model] values every model had before they became each model's own (recsys.run.settings.MODEL_OWNED)
_MODEL_DEFAULTS = {
    "mixer": "attention",
    "block": "pre_norm",
    "init": "scaled",
    "num_heads": 2,
    "filter_alpha": 0.7,
    "attention_dropout": 0.0,
}


def run_config_from_dict(values: dict[str, Any]) -> Config:
    """The config of a saved run from its ``config.json`` contents (see the module docstring; a key
    saved under its old name, :data:`recsys.config.RENAMED`, is read under its new one)."""
    values = renamed(values, warn=False)
    version = values.get("config_version", 1)
    if not isinstance(version, int) or version > CONFIG_VERSION:
        raise ConfigError(
            f"config_version: {version!r} is newer than this recsys reads ({CONFIG_VERSION}); upgrade recsys"
        )
    model = dict(values.get("model", {}))
    train = dict(values.get("train", {}))
    spec = spec_for(model.get("name", ModelConfig().name))
    model.setdefault("score_cap", 0.0)
    model.setdefault("cold_rows", "zero")  # items without clicks were their features alone
    model.setdefault("cold_scale", 1.0)  # ... and scored as trained
    for key, value in _MODEL_DEFAULTS.items():
        model.setdefault(key, value)
    for key, value in _TRAIN_DEFAULTS.items():
        train.setdefault(key, value)
    if "positions" not in model and "positions" in spec.settings:
        model["positions"] = "absolute"
    evaluation = dict(values.get("eval", {}))
    evaluation.setdefault("valid_users", 0)
    retrieval = dict(values.get("retrieval", {}))
    retrieval.setdefault("new_item_share", 0.0)
    sections = {"model": model, "train": train, "eval": evaluation, "retrieval": retrieval}
    for missing, then in spec.saved_defaults.items():
        section, key = missing.split(".")
        if key not in values.get(section, {}):
            for dotted, value in then.items():
                where, leaf = dotted.split(".")
                sections[where][leaf] = value
    return config_from_dict({**values, **sections, "config_version": version})
