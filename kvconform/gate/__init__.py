"""``kvconform gate``: judge a run against a baseline (a stored run, a report folder or an expectations file) and
fail a CI pipeline on what is new, not on the failures it already knows."""
