"""Placeholder: the cbsa module is being written."""
