"""Benchmarks that anyone can rerun: fleetq side by side with its peers, a simulated
fleet's scale, and check jobs' overheads. `fleetq-bench` is their command line
(bench/pyproject.toml; `uv run --project bench fleetq-bench --help`)."""
