"""Print, as JSON, the model tools venv path and its pinned requirements from their one home,
module_utils/model_tools.py, for the model_sync role (run on the controller by a pipe lookup)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "module_utils"))

import model_tools  # noqa: E402

print(json.dumps({"venv": model_tools.MODEL_TOOLS_VENV, "requirements": list(model_tools.MODEL_TOOLS_REQUIREMENTS)}))
