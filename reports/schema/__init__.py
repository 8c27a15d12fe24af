"""JSON Schemas of the report files (report.schema.json: coverage.json, the certification report)."""
