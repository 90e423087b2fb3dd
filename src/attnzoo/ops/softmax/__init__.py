"""Placeholder: the softmax op is being written."""
