"""Placeholder: the linear op is being written."""
