"""`python -m fleetq.runner` is `fleetq-runner`."""

from fleetq.runner.main import main

raise SystemExit(main())
