"""Code that runs inside every image AND on the host: compat data + verdicts, host GPU probe, preflight.

Standard library, PyYAML and packaging only, and nothing else from gpuforge (tests/unit/core/test_layout.py
enforces it): images carry this folder, not the rest of the toolkit.
"""
