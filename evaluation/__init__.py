"""Evaluation: benchmark loading, pure metric functions, LLM-as-judge, reports."""
