"""``python -m stores.migrations``: the migrations command, kept at its documented name.

The migrations themselves live in ``stores/sql/migrations`` beside the SQL store they
migrate; this module only forwards to their command.
"""

from __future__ import annotations

from stores.sql.migrations.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
