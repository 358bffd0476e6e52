"""cudalloc's trace tools: the reader of the trace format (docs/trace-format.md) and the
summary, plot and export commands of `cudalloc-trace` (cli.main)."""
