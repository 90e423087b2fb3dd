"""Placeholder: the softmax module is being written."""
