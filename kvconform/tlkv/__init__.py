"""TLKV: KV block hash, export envelope (v1 f16, v2 e4m3) and the tl.kv.v1 gRPC transfer.

Text: spec/seeds/002_886df638f1c32f75.txt. Requirement ids: conformance/requirements/tlkv.yaml.
"""
