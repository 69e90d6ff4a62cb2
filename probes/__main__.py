"""``python -m probes``: the same as ``gpulens-probe``."""

from probes.cli import main

raise SystemExit(main())
