import sys
from pathlib import Path

# Tests import their tiny-model helpers as `models`.
sys.path.insert(0, str(Path(__file__).parent))
