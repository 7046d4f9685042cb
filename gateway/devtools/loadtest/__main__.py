"""`python -m gateway.devtools.loadtest SCENARIO ...`: the same as `kvgate loadtest`."""

from gateway.devtools.loadtest.cli import main

raise SystemExit(main())
