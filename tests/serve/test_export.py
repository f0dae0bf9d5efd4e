"""Export of every model: the ONNX graph (in ONNX Runtime) and the TorchScript module give the
PyTorch interests within 1e-4, for several batch sizes and lengths (untrained tiny runs)."""

import numpy as np
import pytest
import torch

from recsys.config import load_config
from recsys.models import model_names
from recsys.run import RunDir, build_experiment, load_run
from recsys.serve.export import export_run

TINY = [
    "synthetic.num_users=120",
    "synthetic.num_items=60",
    "synthetic.mean_length=10",
    "data.max_len=8",
    "data.min_item_count=1",
    "data.min_user_count=2",
    "model.dim=8",
    "model.num_interests=3",
    "model.backend=torch",
]


def _tiny_run(path, name: str):
    """A run directory with random weights for model ``name``, loaded back."""
    cfg = load_config(None, TINY + [f"model.name={name}"])
    torch.manual_seed(0)
    exp = build_experiment(cfg)
    rd = RunDir.create(path)
    rd.save_config(cfg)
    rd.save_dataset(exp.dataset)
    rd.save_best(exp.model.state_dict())
    return load_run(path)


@pytest.mark.parametrize("name", [m for m in model_names() if m != "popular"])
def test_export_matches_pytorch_for_every_model(name, tmp_path, random_batches):
    ort = pytest.importorskip("onnxruntime")
    run = _tiny_run(tmp_path / "run", name)
    onnx = ort.InferenceSession(str(export_run(run, tmp_path / "onnx", "onnx") / "interests.onnx"))
    script = torch.jit.load(str(export_run(run, tmp_path / "ts", "torchscript") / "interests.pt"))
    for seq, lengths in random_batches(run.dataset.num_items, run.cfg.data.max_len):
        with torch.no_grad():
            want = run.model.interests(torch.from_numpy(seq), torch.from_numpy(lengths)).numpy()
            got_ts = script(torch.from_numpy(seq), torch.from_numpy(lengths)).numpy()
        (got_onnx,) = onnx.run(None, {"seq": seq, "lengths": lengths})
        assert got_onnx.shape == want.shape == (len(seq), run.model.num_interests, 8)
        np.testing.assert_allclose(got_onnx, want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(got_ts, want, atol=1e-4, rtol=0)


def test_popular_is_refused(tmp_path):
    run = _tiny_run(tmp_path / "run", "popular")
    with pytest.raises(ValueError, match="no network to export"):
        export_run(run, tmp_path / "out", "onnx")
