"""Placeholder: the xca op is being written."""
