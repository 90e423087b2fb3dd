"""Placeholder: the cbsa op is being written."""
