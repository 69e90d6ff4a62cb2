"""``python -m exporter``."""

from exporter.cli import main

raise SystemExit(main())
