"""`fleetq demo`: a whole fleet on one machine, with one command.

The pieces: `repo` makes the demo's git repositories (real commits, real checks);
`scenario` declares the fleet configuration and drives the job stream and the faults;
`fleet` starts and stops the runner processes; `report` turns the run's figures into
the printed report and its verdict; `session` puts them in order. The demo never imports
the runner: runners are separate processes here, as on a real fleet.
"""
