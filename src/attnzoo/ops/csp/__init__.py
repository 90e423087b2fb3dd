"""Placeholder: the csp op is being written."""
