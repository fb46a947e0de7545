"""The chaos suite runs on the integration tier's stack (its helpers live in tests/integration)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))
