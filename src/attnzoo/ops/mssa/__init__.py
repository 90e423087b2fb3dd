"""Placeholder: the mssa op is being written."""
