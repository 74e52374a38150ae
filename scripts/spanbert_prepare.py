#!/usr/bin/env python
"""Same as the ``spanbert-prepare`` console command."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from spanbert_plugin.cli.prepare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
