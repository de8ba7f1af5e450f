"""benches/online/ is a folder of scripts, not a package: its modules import each other by name,
as when a script there runs, so the tests put it on sys.path the same way."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches" / "online"))
