"""Tag protocols of the seeds (ReSearch, Search-R1, R1-Searcher, ExSearch, SmartSearch), one module each."""
