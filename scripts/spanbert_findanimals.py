#!/usr/bin/env python
"""Same as the ``spanbert-findanimals`` console command."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from spanbert_plugin.cli.findanimals import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
