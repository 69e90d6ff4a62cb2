"""``python -m dashboard``: see dashboard.cli."""

from dashboard.cli import main

raise SystemExit(main())
