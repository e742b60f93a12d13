"""`python -m fleetq` is the `fleetq` command."""

from fleetq.cli.entry import main

raise SystemExit(main())
