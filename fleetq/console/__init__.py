"""`fleetq-console`: the operator's live Textual view of the fleet.

`app` holds the views and key bindings, `live` follows LISTEN/NOTIFY, `source` reads the
core read models, `views/` draws each screen, and `dialogs` asks before every action.
"""
