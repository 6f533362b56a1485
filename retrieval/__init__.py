"""Retrieval: corpus reading, BM25 / dense (faiss) / late-interaction indexes, fusion, the HTTP service and client.

Importing this package is cheap: faiss, torch, bm25s and colbert are imported only when an index is built or
loaded.
"""
