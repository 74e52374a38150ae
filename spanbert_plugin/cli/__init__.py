"""Console commands: thin wrappers (parse, call the library, report), like fairseq_cli."""
