"""Placeholder: the linear module is being written."""
