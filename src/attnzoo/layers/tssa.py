"""Placeholder: the tssa module is being written."""
