"""`python -m loadtests.scenario SCENARIO ...`: the same as `kvgate loadtest`."""

from loadtests.scenario.cli import main

raise SystemExit(main())
