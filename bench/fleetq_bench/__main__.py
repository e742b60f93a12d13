"""`python -m fleetq_bench` is the `fleetq-bench` command."""

from fleetq_bench.cli import main

raise SystemExit(main())
