"""The results store: every recorded run of ``kvconform run`` and ``kvconform matrix`` (identity, inputs and each
check's verdict) in one schema, on SQLite (standard library, the default) or PostgreSQL (``psycopg``, the extra
``postgres``), for ``kvconform gate`` and history."""

from kvconform.store.folders import read_run_dir
from kvconform.store.matrix_record import read_matrix_dir
from kvconform.store.record import CheckRecord, ReportError, RunRecord, read_report_dir
from kvconform.store.store import ResultsStore, StoreError, open_store
from kvconform.store.url import StoreURL, StoreURLError, parse_store_url

__all__ = ["CheckRecord", "ReportError", "ResultsStore", "RunRecord", "StoreError", "StoreURL", "StoreURLError",
           "open_store", "parse_store_url", "read_matrix_dir", "read_report_dir", "read_run_dir"]
