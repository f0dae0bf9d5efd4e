"""The core library works without the serve extra; `recsys serve` then names the extra."""

import subprocess
import sys
from pathlib import Path

from recsys.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_core_imports_without_fastapi():
    code = (
        "import sys; sys.modules['fastapi'] = None; sys.modules['uvicorn'] = None\n"
        "import recsys.cli, recsys.serve, recsys.serve.batch, recsys.serve.microbatch, recsys.run.index, recsys.api\n"
        "try:\n    import recsys.serve.app\nexcept ImportError as err:\n    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert "pip install 'multi-interest-recsys[serve]'" in out.stdout


def test_serve_command_names_the_extra(tiny_run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    monkeypatch.delitem(sys.modules, "recsys.serve.app", raising=False)
    assert main(["serve", tiny_run, "--port", "1"]) == 2
    assert "pip install 'multi-interest-recsys[serve]'" in capsys.readouterr().err
