"""Harness tests of the plugfest matrix (``kvconform matrix``)."""
