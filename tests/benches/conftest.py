"""benches/ and benches/online/ are folders of scripts, not packages: their modules import
each other by name, as when a script there runs, so the tests put them on sys.path the same
way."""

import sys
from pathlib import Path

BENCHES = Path(__file__).resolve().parents[2] / "benches"
sys.path.append(str(BENCHES))  # after everything else: its names shadow nothing
sys.path.insert(0, str(BENCHES / "online"))
