"""Mininet integration: ``wan.py`` (custom topology) and an example experiment."""
