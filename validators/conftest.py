"""Registers the gpuforge validator plugin; everything lives in validators/plugin.py."""

pytest_plugins = ["plugin"]
