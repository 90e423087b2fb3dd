"""Placeholder: the mssa module is being written."""
