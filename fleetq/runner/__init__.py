"""`fleetq-runner`: claims, stages, runs and reports jobs on one node.

`service` composes the loops (claims per lane, heartbeat and self-fence, reaper,
collection, LISTEN, outcome writer) under the error rule of `loops`; `execution` is one
job's journey (stage, launch, report), `executor` runs a command or a handler, `identity`
keeps one process per runner id, and `journal`/`collection`/`orphans` settle what an
earlier process left behind.
"""
