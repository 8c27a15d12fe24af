"""``kvconform history``: the results store as pages (a stable latest page, an immutable page per run, a
requirement × run table of each implementation's verdict changes, and the flaky checks, as ``kvconform gate``
defines them)."""
