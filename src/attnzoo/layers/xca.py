"""Placeholder: the xca module is being written."""
