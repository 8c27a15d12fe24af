"""The fuzz targets of each protocol: ``<protocol>.py`` lists its ``TARGETS``."""
