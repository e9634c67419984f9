"""The backend is chosen inside engine/ops (engine/ops/fused.py), one dispatch per op: model files import neither
Triton nor our Triton modules, and importing the model (even building it on the CPU) loads no Triton module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRITON_MODULES = ("triton", "engine.ops.triton_", "fla")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):  # deferred imports inside functions count too
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def test_model_files_never_import_triton() -> None:
    for path in sorted((ROOT / "engine" / "models").rglob("*.py")):
        bad = [name for name in _imports(path) if name.startswith(TRITON_MODULES)]
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}: dispatch through engine.ops instead"


def test_building_the_model_on_the_cpu_loads_no_triton_module(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from engine.checkpoint.demo import write_demo\n"
        "from engine.models.glm5_next.model import Glm5NextForCausalLM\n"
        f"write_demo({str(tmp_path)!r}, seed=0, size='tiny')\n"
        f"model = Glm5NextForCausalLM.load({str(tmp_path)!r})\n"
        "model.prefill(model.new_sequence(model.make_pool(64)), [1, 2, 3])\n"
        "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith(('triton.', 'engine.ops.triton_'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
