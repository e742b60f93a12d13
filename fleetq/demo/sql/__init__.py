"""SQL blocks of the demo's own database: where it lives and its one-run-at-a-time lock."""
