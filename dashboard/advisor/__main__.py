"""``python -m dashboard.advisor`` runs gpulens-advisor."""

from dashboard.advisor.cli import main

raise SystemExit(main())
