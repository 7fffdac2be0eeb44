"""Print, as JSON, the model tools venv path and its pinned requirements from their one home,
module_utils/model_tools.py, for the model_sync role (run on the controller by a pipe lookup).

The constants are read as literals from the source, not imported: the module imports Ansible's
module_utils namespace, which only exists inside a module run."""

import ast
import json
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[3] / "module_utils" / "model_tools.py"


def constants() -> dict:
    found = {}
    for node in ast.parse(SOURCE.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("MODEL_TOOLS_VENV", "MODEL_TOOLS_REQUIREMENTS"):
            found[target.id] = ast.literal_eval(node.value)
    return found


values = constants()
if set(values) != {"MODEL_TOOLS_VENV", "MODEL_TOOLS_REQUIREMENTS"}:
    sys.exit(f"{SOURCE}: MODEL_TOOLS_VENV and MODEL_TOOLS_REQUIREMENTS must be literal assignments")
requirements = list(values["MODEL_TOOLS_REQUIREMENTS"])
print(json.dumps({"venv": values["MODEL_TOOLS_VENV"], "requirements": requirements}))
