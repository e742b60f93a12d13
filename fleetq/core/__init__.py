"""The queue's foundation: models, errors, database access, migrations, protocol.

`core` imports neither `runner` nor `console` (an import-linter contract), so every
process speaks the same protocol through the same code.
"""
