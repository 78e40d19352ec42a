"""``python -m emulation``: see ``emulation.cli``."""

from emulation.cli import main

raise SystemExit(main())
