"""`python -m loadtests.hotscan SCENARIO ...`."""

from loadtests.hotscan.cli import main

raise SystemExit(main())
