"""Placeholder: the csp module is being written."""
