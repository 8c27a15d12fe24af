"""Deliberately broken implementations: each breaks one requirement, and the suite citing it must fail."""
