"""ACME's KV-cache export library (an example: a real vendor's code would not import kvconform)."""
