"""`python -m recsys` is the `recsys` command."""

from recsys.cli import main

raise SystemExit(main())
