"""Load and overhead benchmarks for kvgate (run by hand, not by the test suite). See loadtests/README.md."""
