"""Placeholder: the fastmax module is being written."""
