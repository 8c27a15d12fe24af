"""The interop lane: kvconform's MOQT stack against third-party peers run in docker (``pytest -m interop``)."""
