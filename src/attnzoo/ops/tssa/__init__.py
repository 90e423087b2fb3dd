"""Placeholder: the tssa op is being written."""
