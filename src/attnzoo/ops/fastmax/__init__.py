"""Placeholder: the fastmax op is being written."""
