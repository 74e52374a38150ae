"""Folder to pass to fairseq's ``--user-dir``: registers spanbert_plugin once (``spanbert_plugin.registry``).

fairseq imports this folder as a top-level module named ``user_dir``; all
registrations live in the ``spanbert_plugin`` package, so importing either
(or both) registers every component exactly once.
"""
import os
import sys

try:
    import spanbert_plugin.registry  # noqa: F401
except ImportError:  # not installed: use the checkout this folder lives in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import spanbert_plugin.registry  # noqa: F401
