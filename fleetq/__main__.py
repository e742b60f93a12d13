"""`python -m fleetq` is the `fleetq` command."""

from fleetq.cli.main import main

raise SystemExit(main())
