"""Registered components; see spanbert_plugin/__init__.py."""
