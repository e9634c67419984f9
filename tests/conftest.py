import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

# No test may reach the Hugging Face Hub (or anything off this machine): the recipe's download then uses the cache
# only. The download tests lift this for a stand-in Hub on 127.0.0.1 (tests/recipe/hub_server.py).
import os  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
